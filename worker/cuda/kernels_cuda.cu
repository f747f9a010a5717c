#include <algorithm>
#include <cmath>
#include <cstdint>

#include "worker/cuda/kernels_cuda.h"
#include "worker/cuda/launch.cuh"

namespace dslaunch::worker::cuda {
namespace {

using namespace launch;  // NOLINT: kThreads, Blocks, WarpSum, ...

// Row groups of the column reductions (LayerNorm's weight and bias
// gradients, a matmul's bias gradient): partial sums per group, then one
// ordered sum per column.
constexpr int kRowGroups = 64;
constexpr int kRowsPerBlock = 8;

// ------------------------------------------------------------ embedding

__global__ void EncoderForwardKernel(float* out, const int* inp,
                                     const float* wte, const float* wpe, int BT,
                                     int T, int C) {
  const size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x;
  if (i >= static_cast<size_t>(BT) * C) return;
  const int bt = static_cast<int>(i / C), c = static_cast<int>(i % C);
  const int t = bt % T;
  out[i] = wte[static_cast<size_t>(inp[bt]) * C + c] +
           wpe[static_cast<size_t>(t) * C + c];
}

__global__ void EncoderBackwardWpeKernel(float* dwpe, const float* dout, int B,
                                         int T, int C) {
  const size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x;
  if (i >= static_cast<size_t>(T) * C) return;
  float sum = 0;
  for (int b = 0; b < B; b++) sum += dout[static_cast<size_t>(b) * T * C + i];
  dwpe[i] += sum;
}

__global__ void EncoderBackwardWteKernel(float* dwte, const float* dout,
                                         const int* tokens, const int* offsets,
                                         const int* positions, int C) {
  const int u = blockIdx.x;
  const int begin = offsets[u], end = offsets[u + 1];
  float* row = dwte + static_cast<size_t>(tokens[u]) * C;
  for (int c = threadIdx.x; c < C; c += blockDim.x) {
    float sum = 0;
    for (int k = begin; k < end; k++)
      sum += dout[static_cast<size_t>(positions[k]) * C + c];
    row[c] += sum;
  }
}

// ------------------------------------------------------------ rounding

// Rounds one float to T (bf16 or fp16), two at a time.
template <typename T>
__device__ T Round(float x);
template <>
__device__ __nv_bfloat16 Round(float x) {
  return __float2bfloat16_rn(x);
}
template <>
__device__ __half Round(float x) {
  return __float2half_rn(x);
}
template <typename T2>
__device__ T2 Round2(float a, float b);
template <>
__device__ __nv_bfloat162 Round2(float a, float b) {
  return __floats2bfloat162_rn(a, b);
}
template <>
__device__ __half2 Round2(float a, float b) {
  return __floats2half2_rn(a, b);
}

// A value as the products take it: fp32 as it is, or rounded to the
// 16-bit operand type.
__device__ inline void Put(float* p, float x) { *p = x; }
template <typename T>
__device__ inline void Put(T* p, float x) {
  *p = Round<T>(x);
}

// ------------------------------------------------------------ LayerNorm

// One warp per row.
// With `other`, the row is inp + other, written to `sum` first (the
// residual, in the same pass; each lane then reads back only what it
// wrote). O: float, or the 16-bit type the output is rounded to.
template <typename O>
__global__ void LayerNormForwardKernel(O* out, float* mean, float* rstd,
                                       const float* inp, const float* weight,
                                       const float* bias, int N, int C,
                                       const float* other, float* sum) {
  const int row = blockIdx.x * (blockDim.x / kWarp) + threadIdx.x / kWarp;
  const int lane = threadIdx.x % kWarp;
  if (row >= N) return;
  const float* x = inp + static_cast<size_t>(row) * C;
  if (other != nullptr) {
    const float* o = other + static_cast<size_t>(row) * C;
    float* r = sum + static_cast<size_t>(row) * C;
    for (int c = lane; c < C; c += kWarp) r[c] = x[c] + o[c];
    x = r;
  }
  float s = 0;
  for (int c = lane; c < C; c += kWarp) s += x[c];
  const float m = WarpSum(s) / C;
  float v = 0;
  for (int c = lane; c < C; c += kWarp) {
    const float d = x[c] - m;
    v += d * d;
  }
  const float r = 1.0f / sqrtf(WarpSum(v) / C + 1e-5f);
  O* y = out + static_cast<size_t>(row) * C;
  for (int c = lane; c < C; c += kWarp)
    Put(y + c, (x[c] - m) * r * weight[c] + bias[c]);
  if (lane == 0) {
    mean[row] = m;
    rstd[row] = r;
  }
}

// dinp, one warp per row.
__global__ void LayerNormBackwardInputKernel(float* dinp, const float* dout,
                                             const float* inp,
                                             const float* weight,
                                             const float* mean,
                                             const float* rstd, int N, int C) {
  const int row = blockIdx.x * (blockDim.x / kWarp) + threadIdx.x / kWarp;
  const int lane = threadIdx.x % kWarp;
  if (row >= N) return;
  const size_t base = static_cast<size_t>(row) * C;
  const float m = mean[row], r = rstd[row];
  float a = 0, b = 0;
  for (int c = lane; c < C; c += kWarp) {
    const float dnorm = weight[c] * dout[base + c];
    a += dnorm;
    b += dnorm * (inp[base + c] - m) * r;
  }
  a = WarpSum(a) / C;
  b = WarpSum(b) / C;
  for (int c = lane; c < C; c += kWarp) {
    const float xhat = (inp[base + c] - m) * r;
    const float dnorm = weight[c] * dout[base + c];
    dinp[base + c] += (dnorm - a - xhat * b) * r;
  }
}

constexpr float kGeluScale = 0.7978845608028654f;  // sqrt(2 / pi)

// gelu'(x), the tanh form's, every rounding spelt out (no contraction
// left to the compiler): the same bits in every kernel that calls it.
__device__ inline float GeluGrad(float x) {
  const float x2 = __fmul_rn(x, x);
  const float u =
      __fmul_rn(kGeluScale, __fmaf_rn(0.044715f, __fmul_rn(x2, x), x));
  const float th = tanhf(u);
  const float sech2 = __fmaf_rn(-th, th, 1.0f);
  const float left = __fmul_rn(0.5f, __fadd_rn(1.0f, th));
  const float slope =
      __fmul_rn(__fmul_rn(__fmul_rn(0.5f, x), sech2), kGeluScale);
  return __fmaf_rn(slope, __fmaf_rn(3.0f * 0.044715f, x2, 1.0f), left);
}

// Column sums over rows in kRowGroups groups: block (32 columns,
// kRowsPerBlock rows), grid (column blocks, kRowGroups). With inp set, also
// the sums of dout * xhat (LayerNorm's weight gradient). partial holds
// kRowGroups rows of C sums each, for dout then dout * xhat. With rounded
// set, dout rounded to R there too (read once for both; fp32 with R
// float). With gelu_in set, each dout is first gelu'(gelu_in) * dout
// (GELU's backward, the product rounded as GeluBackward's).
template <typename R>
__global__ void ColumnPartialsKernel(float* partial, const float* dout,
                                     const float* inp, const float* mean,
                                     const float* rstd, int N, int C,
                                     R* rounded, const float* gelu_in) {
  __shared__ float sb[kRowsPerBlock][kWarp + 1];
  __shared__ float sw[kRowsPerBlock][kWarp + 1];
  const int c = blockIdx.x * kWarp + threadIdx.x;
  float accb = 0, accw = 0;
  if (c < C) {
    for (int r = blockIdx.y * kRowsPerBlock + threadIdx.y; r < N;
         r += kRowGroups * kRowsPerBlock) {
      const size_t i = static_cast<size_t>(r) * C + c;
      const float d = gelu_in != nullptr
                          ? __fmul_rn(GeluGrad(gelu_in[i]), dout[i])
                          : dout[i];
      if (rounded != nullptr) Put(rounded + i, d);
      accb += d;
      if (inp != nullptr) accw += d * ((inp[i] - mean[r]) * rstd[r]);
    }
  }
  sb[threadIdx.y][threadIdx.x] = accb;
  sw[threadIdx.y][threadIdx.x] = accw;
  __syncthreads();
  if (threadIdx.y == 0 && c < C) {
    float tb = 0, tw = 0;
    for (int y = 0; y < kRowsPerBlock; y++) {
      tb += sb[y][threadIdx.x];
      tw += sw[y][threadIdx.x];
    }
    partial[static_cast<size_t>(blockIdx.y) * C + c] = tb;
    partial[static_cast<size_t>(kRowGroups + blockIdx.y) * C + c] = tw;
  }
}

// dbias[c] += sum of the groups' dout sums; dweight (may be null) likewise
// with the dout * xhat sums.
__global__ void ColumnFinishKernel(float* dweight, float* dbias,
                                   const float* partial, int C) {
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= C) return;
  float tb = 0, tw = 0;
  for (int g = 0; g < kRowGroups; g++) {
    tb += partial[static_cast<size_t>(g) * C + c];
    tw += partial[static_cast<size_t>(kRowGroups + g) * C + c];
  }
  if (dbias != nullptr) dbias[c] += tb;
  if (dweight != nullptr) dweight[c] += tw;
}

// fn(p): p `rounded` as a pointer to the 16-bit operand type, or
// `otherwise` where there is none (no pointer, or an fp32 mode).
template <typename Fn>
void AsOperandType(const Ctx& ctx, void* rounded, float* otherwise,
                   const Fn& fn) {
  if (rounded == nullptr || ctx.operands == CUDA_R_32F) {
    fn(otherwise);
  } else if (ctx.operands == CUDA_R_16F) {
    fn(static_cast<__half*>(rounded));
  } else {
    fn(static_cast<__nv_bfloat16*>(rounded));
  }
}

// rounded: null, or dout rounded to ctx.operands there (in the fp32 modes
// written to `written` instead, where there is one); gelu_in: as the
// kernel's.
void ColumnSums(const Ctx& ctx, float* dweight, float* dbias, const float* dout,
                const float* inp, const float* mean, const float* rstd, int N,
                int C, float* scratch, void* rounded = nullptr,
                float* written = nullptr, const float* gelu_in = nullptr) {
  const dim3 grid((C + kWarp - 1) / kWarp, kRowGroups);
  const dim3 block(kWarp, kRowsPerBlock);
  AsOperandType(ctx, rounded, written, [&](auto* r) {
    ColumnPartialsKernel<<<grid, block, 0, ctx.stream>>>(
        scratch, dout, inp, mean, rstd, N, C, r, gelu_in);
  });
  ColumnFinishKernel<<<Blocks(C), kThreads, 0, ctx.stream>>>(dweight, dbias,
                                                             scratch, C);
}

// ------------------------------------------------------------ pointwise

__global__ void BiasRowsKernel(float* out, const float* bias, int N, int OC) {
  const size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x;
  if (i >= static_cast<size_t>(N) * OC) return;
  out[i] = bias != nullptr ? bias[i % OC] : 0.0f;
}

template <typename O>
__global__ void GeluForwardKernel(O* out, const float* inp, size_t n) {
  const size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x;
  if (i >= n) return;
  const float x = inp[i];
  const float u = kGeluScale * (x + 0.044715f * x * x * x);
  Put(out + i, 0.5f * x * (1.0f + tanhf(u)));
}

__global__ void GeluBackwardKernel(float* dinp, const float* inp,
                                   const float* dout, size_t n, bool add) {
  const size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x;
  if (i >= n) return;
  const float d = __fmul_rn(GeluGrad(inp[i]), dout[i]);
  dinp[i] = add ? dinp[i] + d : d;
}

// Four elements per thread (in must be 16-byte aligned), the tail one by
// one.
template <typename T, typename T2>
__global__ void To16x4Kernel(T* out, const float* in, size_t n) {
  const size_t i =
      4 * (blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x);
  if (i + 3 < n) {
    const float4 v = *reinterpret_cast<const float4*>(in + i);
    *reinterpret_cast<T2*>(out + i) = Round2<T2>(v.x, v.y);
    *reinterpret_cast<T2*>(out + i + 2) = Round2<T2>(v.z, v.w);
  } else {
    for (size_t j = i; j < n; j++) out[j] = Round<T>(in[j]);
  }
}

template <typename T>
__global__ void To16Kernel(T* out, const float* in, size_t n) {
  const size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x;
  if (i < n) out[i] = Round<T>(in[i]);
}

template <typename T, typename T2>
void LaunchTo16(const Ctx& ctx, T* out, const float* in, size_t n) {
  const bool aligned = reinterpret_cast<uintptr_t>(in) % 16 == 0 &&
                       reinterpret_cast<uintptr_t>(out) % 8 == 0;
  if (aligned) {
    To16x4Kernel<T, T2>
        <<<Blocks((n + 3) / 4), kThreads, 0, ctx.stream>>>(out, in, n);
  } else {
    To16Kernel<T><<<Blocks(n), kThreads, 0, ctx.stream>>>(out, in, n);
  }
}

__global__ void ResidualKernel(float* out, const float* a, const float* b,
                               size_t n) {
  const size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x;
  if (i < n) out[i] = a[i] + b[i];
}

// ------------------------------------------------------------ classifier

// One block per row: the online max and sum of exp over the real columns,
// then (backward) the gradient written over the logits (fp32) or into a
// 16-bit copy for the head's products.
constexpr int kClassifierThreads = 1024;

// grad: where the gradient goes (the logits themselves, or a 16-bit copy).
template <typename G>
__global__ void FusedClassifierKernel(float* logits, G* grad, float* losses,
                                      const int* targets, int V, int Vp,
                                      float dloss, bool backward) {
  __shared__ float sm[kClassifierThreads / kWarp],
      ss[kClassifierThreads / kWarp];
  __shared__ float row_lse, target_logit;
  float* x = logits + static_cast<size_t>(blockIdx.x) * Vp;
  const int target = targets[blockIdx.x];
  if (threadIdx.x == 0) target_logit = x[target];
  float m = -INFINITY, s = 0;
  for (int j = threadIdx.x; j < V; j += blockDim.x) {
    const float v = x[j];
    if (v > m) {
      s = s * expf(m - v) + 1.0f;
      m = v;
    } else {
      s += expf(v - m);
    }
  }
  // Combine (m, s) pairs across the warp, then across warps.
  for (int o = kWarp / 2; o > 0; o /= 2) {
    const float m2 = __shfl_xor_sync(0xffffffff, m, o);
    const float s2 = __shfl_xor_sync(0xffffffff, s, o);
    const float mm = fmaxf(m, m2);
    s = (m == -INFINITY ? 0.0f : s * expf(m - mm)) +
        (m2 == -INFINITY ? 0.0f : s2 * expf(m2 - mm));
    m = mm;
  }
  const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp;
  if (lane == 0) {
    sm[warp] = m;
    ss[warp] = s;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    float M = -INFINITY, S = 0;
    for (int w = 0; w < static_cast<int>(blockDim.x / kWarp); w++) {
      const float mm = fmaxf(M, sm[w]);
      S = (M == -INFINITY ? 0.0f : S * expf(M - mm)) +
          (sm[w] == -INFINITY ? 0.0f : ss[w] * expf(sm[w] - mm));
      M = mm;
    }
    row_lse = M + logf(S);
    losses[blockIdx.x] = row_lse - target_logit;
  }
  __syncthreads();
  if (!backward) return;
  const float lse = row_lse;
  G* out = grad + static_cast<size_t>(blockIdx.x) * Vp;
  for (int j = threadIdx.x; j < Vp; j += blockDim.x) {
    float g = 0;
    if (j < V) g = dloss * (expf(x[j] - lse) - (j == target ? 1.0f : 0.0f));
    Put(out + j, g);
  }
}

// ------------------------------------------------------------ optimizer

__global__ void AdamKernel(float* params, const float* grads, float* m,
                           float* v, size_t n, AdamConstants k,
                           float grad_scale) {
  const size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x;
  if (i >= n) return;
  float p = params[i];
  float g = grads[i];
  if (grad_scale != 1.0f) g = __fmul_rn(g, grad_scale);
  if (k.decay) {
    if (k.adamw) {
      p = __fmul_rn(p, k.decay_mul);
    } else {
      g = __fmaf_rn(p, k.decay_mul, g);
    }
  }
  const float mi = __fmaf_rn(g, k.one_minus_b1, __fmul_rn(m[i], k.b1));
  const float vi =
      __fmaf_rn(__fmul_rn(k.one_minus_b2, g), g, __fmul_rn(v[i], k.b2));
  const float denom = __fadd_rn(__fdiv_rn(__fsqrt_rn(vi), k.sqrt_bc2), k.eps);
  p = __fadd_rn(p, __fdiv_rn(__fmul_rn(k.neg_step, mi), denom));
  m[i] = mi;
  v[i] = vi;
  params[i] = p;
}

__global__ void SquaredSumKernel(const float* g, size_t n, double* partials) {
  __shared__ double part[kThreads];
  double acc = 0;
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x;
       i < n; i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    const double x = g[i];
    acc += x * x;
  }
  part[threadIdx.x] = acc;
  __syncthreads();
  for (int s = kThreads / 2; s > 0; s /= 2) {
    if (threadIdx.x < s) part[threadIdx.x] += part[threadIdx.x + s];
    __syncthreads();
  }
  if (threadIdx.x == 0) partials[blockIdx.x] = part[0];
}

}  // namespace

// ------------------------------------------------------------ host side

namespace {

// Elements of an operand as stored whose op is rows x cols: `rows` rows of
// ld (cols rows when transposed).
size_t OperandElems(bool trans, int rows, int cols, int ld) {
  return static_cast<size_t>(trans ? cols : rows) * ld;
}

}  // namespace

cublasStatus_t RowGemm(const Ctx& ctx, bool trans_a, bool trans_b, int M, int N,
                       int K, float alpha, Operand A, int lda, Operand B,
                       int ldb, float beta, float* C, int ldc) {
  // Row-major C = op(A) op(B) is column-major C^T = op(B)^T op(A)^T.
  const cublasOperation_t op_a = trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t op_b = trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  if (ctx.operands == CUDA_R_32F) {
    if (A.fp32 == nullptr || B.fp32 == nullptr)
      return CUBLAS_STATUS_INVALID_VALUE;
    return cublasGemmEx(ctx.blas, op_b, op_a, N, M, K, &alpha, B.fp32,
                        CUDA_R_32F, ldb, A.fp32, CUDA_R_32F, lda, &beta, C,
                        CUDA_R_32F, ldc, ctx.compute, CUBLAS_GEMM_DEFAULT);
  }
  // Every check before any rounding, so that a refusal changes nothing.
  const size_t a_elems = OperandElems(trans_a, M, K, lda);
  const size_t b_elems = OperandElems(trans_b, K, N, ldb);
  const bool round_a = A.rounded == nullptr, round_b = B.rounded == nullptr;
  if ((round_a && (A.fp32 == nullptr || a_elems > ctx.operand_a_elems)) ||
      (round_b && (B.fp32 == nullptr || b_elems > ctx.operand_b_elems)) ||
      (round_a && B.rounded == ctx.operand_a) ||
      (round_b && A.rounded == ctx.operand_b))
    return CUBLAS_STATUS_INVALID_VALUE;
  if (round_a) To16Bit(ctx, ctx.operands, ctx.operand_a, A.fp32, a_elems);
  if (round_b) To16Bit(ctx, ctx.operands, ctx.operand_b, B.fp32, b_elems);
  return cublasGemmEx(ctx.blas, op_b, op_a, N, M, K, &alpha,
                      round_b ? ctx.operand_b : B.rounded, ctx.operands, ldb,
                      round_a ? ctx.operand_a : A.rounded, ctx.operands, lda,
                      &beta, C, CUDA_R_32F, ldc, CUBLAS_COMPUTE_32F,
                      CUBLAS_GEMM_DEFAULT);
}

void EncoderForward(const Ctx& ctx, float* out, const int* inp,
                    const float* wte, const float* wpe, int B, int T, int C) {
  const size_t n = static_cast<size_t>(B) * T * C;
  EncoderForwardKernel<<<Blocks(n), kThreads, 0, ctx.stream>>>(
      out, inp, wte, wpe, B * T, T, C);
}

void EncoderBackwardWpe(const Ctx& ctx, float* dwpe, const float* dout, int B,
                        int T, int C) {
  EncoderBackwardWpeKernel<<<Blocks(static_cast<size_t>(T) * C), kThreads, 0,
                             ctx.stream>>>(dwpe, dout, B, T, C);
}

void EncoderBackwardWte(const Ctx& ctx, float* dwte, const float* dout,
                        const int* tokens, const int* offsets,
                        const int* positions, int n_unique, int C) {
  if (n_unique == 0) return;
  EncoderBackwardWteKernel<<<n_unique, kThreads, 0, ctx.stream>>>(
      dwte, dout, tokens, offsets, positions, C);
}

void LayerNormForward(const Ctx& ctx, float* out, float* mean, float* rstd,
                      const float* inp, const float* weight, const float* bias,
                      int N, int C, void* out16) {
  ResidualLayerNormForward(ctx, nullptr, out, mean, rstd, inp, nullptr, weight,
                           bias, N, C, out16);
}

void ResidualLayerNormForward(const Ctx& ctx, float* res, float* out,
                              float* mean, float* rstd, const float* inp1,
                              const float* inp2, const float* weight,
                              const float* bias, int N, int C, void* out16) {
  AsOperandType(ctx, out16, out, [&](auto* o) {
    LayerNormForwardKernel<<<WarpRowBlocks(N), kThreads, 0, ctx.stream>>>(
        o, mean, rstd, inp1, weight, bias, N, C, inp2, res);
  });
}

void LayerNormBackward(const Ctx& ctx, float* dinp, float* dweight,
                       float* dbias, const float* dout, const float* inp,
                       const float* weight, const float* mean,
                       const float* rstd, int N, int C, float* scratch) {
  LayerNormBackwardInputKernel<<<WarpRowBlocks(N), kThreads, 0, ctx.stream>>>(
      dinp, dout, inp, weight, mean, rstd, N, C);
  ColumnSums(ctx, dweight, dbias, dout, inp, mean, rstd, N, C, scratch);
}

size_t LayerNormScratchFloats(int C) {
  return 2 * static_cast<size_t>(kRowGroups) * C;
}

cublasStatus_t MatmulForward(const Ctx& ctx, float* out, Operand inp,
                             const float* weight, const float* bias, int N,
                             int C, int OC) {
  if (ctx.operands == CUDA_R_32F && inp.fp32 == nullptr)
    return CUBLAS_STATUS_INVALID_VALUE;
  const size_t a = static_cast<size_t>(N) * C, b = static_cast<size_t>(OC) * C;
  if (bias != nullptr && ctx.lt != nullptr) {
    if (ctx.operands == CUDA_R_32F) {
      if (inp.fp32 != nullptr &&
          LtGemmBias(ctx, false, true, N, OC, C, inp.fp32, C, weight, C,
                     CUDA_R_32F, ctx.compute, bias, out, OC))
        return CUBLAS_STATUS_SUCCESS;
    } else {
      if ((inp.rounded == nullptr &&
           (inp.fp32 == nullptr || a > ctx.operand_a_elems)) ||
          inp.rounded == ctx.operand_b || b > ctx.operand_b_elems)
        return CUBLAS_STATUS_INVALID_VALUE;
      if (inp.rounded == nullptr) {
        To16Bit(ctx, ctx.operands, ctx.operand_a, inp.fp32, a);
        inp = Operand::Rounded(ctx.operand_a);
      }
      To16Bit(ctx, ctx.operands, ctx.operand_b, weight, b);
      if (LtGemmBias(ctx, false, true, N, OC, C, inp.rounded, C, ctx.operand_b,
                     C, ctx.operands, CUBLAS_COMPUTE_32F, bias, out, OC))
        return CUBLAS_STATUS_SUCCESS;
      // A shape cuBLASLt takes no algorithm for: the product below, on the
      // operands as rounded.
      BiasRowsKernel<<<Blocks(static_cast<size_t>(N) * OC), kThreads, 0,
                       ctx.stream>>>(out, bias, N, OC);
      return RowGemm(ctx, false, true, N, OC, C, 1.0f, inp, C,
                     Operand::Rounded(ctx.operand_b), C, 1.0f, out, OC);
    }
  }
  float beta = 0;
  if (bias != nullptr) {
    BiasRowsKernel<<<Blocks(static_cast<size_t>(N) * OC), kThreads, 0,
                     ctx.stream>>>(out, bias, N, OC);
    beta = 1;
  }
  return RowGemm(ctx, false, true, N, OC, C, 1.0f, inp, C, weight, C, beta, out,
                 OC);
}

cublasStatus_t MatmulBackward(const Ctx& ctx, float* dinp, float* dweight,
                              float* dbias, Operand dout, Operand inp,
                              const float* weight, int N, int C, int OC,
                              float* scratch, float dinp_beta) {
  // A rounded dout comes with its bias sums done (they need the fp32).
  if (dout.rounded != nullptr && dbias != nullptr)
    return CUBLAS_STATUS_INVALID_VALUE;
  if (ctx.operands != CUDA_R_32F) {
    // dout rounded once for both products (with the bias sums when there
    // is a bias: one read of dout), unless it comes so.
    // Every size first, so that a refusal changes nothing.
    const size_t nc = static_cast<size_t>(N) * C;
    if ((dout.rounded == nullptr &&
         (dout.fp32 == nullptr ||
          static_cast<size_t>(N) * OC > ctx.operand_a_elems)) ||
        (dinp != nullptr && dout.rounded == ctx.operand_b) ||
        static_cast<size_t>(OC) * C > ctx.operand_b_elems ||
        (inp.rounded == nullptr &&
         (inp.fp32 == nullptr || nc > ctx.operand_b_elems)) ||
        (inp.rounded != nullptr &&
         inp.rounded ==
             (dout.rounded != nullptr ? dout.rounded : ctx.operand_a)) ||
        (dinp != nullptr && inp.rounded == ctx.operand_b))
      return CUBLAS_STATUS_INVALID_VALUE;
    if (dout.rounded == nullptr && dbias != nullptr) {
      ColumnSums(ctx, nullptr, dbias, dout.fp32, nullptr, nullptr, nullptr, N,
                 OC, scratch, ctx.operand_a);
    } else if (dout.rounded == nullptr) {
      To16Bit(ctx, ctx.operands, ctx.operand_a, dout.fp32,
              static_cast<size_t>(N) * OC);
    }
    const Operand rounded_dout =
        dout.rounded != nullptr ? dout : Operand::Rounded(ctx.operand_a);
    cublasStatus_t st = CUBLAS_STATUS_SUCCESS;
    if (dinp != nullptr) {
      st = RowGemm(ctx, false, false, N, C, OC, 1.0f, rounded_dout, OC, weight,
                   C, dinp_beta, dinp, C);
    }
    if (st != CUBLAS_STATUS_SUCCESS) return st;
    return RowGemm(ctx, true, false, OC, C, N, 1.0f, rounded_dout, OC, inp, C,
                   1.0f, dweight, C);
  }
  if (inp.fp32 == nullptr || dout.fp32 == nullptr)
    return CUBLAS_STATUS_INVALID_VALUE;
  if (dinp != nullptr) {
    const cublasStatus_t st = RowGemm(ctx, false, false, N, C, OC, 1.0f, dout,
                                      OC, weight, C, dinp_beta, dinp, C);
    if (st != CUBLAS_STATUS_SUCCESS) return st;
  }
  const cublasStatus_t st = RowGemm(ctx, true, false, OC, C, N, 1.0f, dout, OC,
                                    inp, C, 1.0f, dweight, C);
  if (st != CUBLAS_STATUS_SUCCESS) return st;
  if (dbias != nullptr) {
    ColumnSums(ctx, nullptr, dbias, dout.fp32, nullptr, nullptr, nullptr, N, OC,
               scratch);
  }
  return CUBLAS_STATUS_SUCCESS;
}

void GeluForward(const Ctx& ctx, float* out, const float* inp, size_t n,
                 void* out16) {
  AsOperandType(ctx, out16, out, [&](auto* o) {
    GeluForwardKernel<<<Blocks(n), kThreads, 0, ctx.stream>>>(o, inp, n);
  });
}

void GeluBackwardBias(const Ctx& ctx, float* out, void* rounded, float* dbias,
                      const float* inp, const float* dout, int N, int C,
                      float* scratch) {
  ColumnSums(ctx, nullptr, dbias, dout, nullptr, nullptr, nullptr, N, C,
             scratch, rounded, out, inp);
}

void GeluBackward(const Ctx& ctx, float* dinp, const float* inp,
                  const float* dout, size_t n, bool add) {
  GeluBackwardKernel<<<Blocks(n), kThreads, 0, ctx.stream>>>(dinp, inp, dout, n,
                                                             add);
}

void ResidualForward(const Ctx& ctx, float* out, const float* inp1,
                     const float* inp2, size_t n) {
  ResidualKernel<<<Blocks(n), kThreads, 0, ctx.stream>>>(out, inp1, inp2, n);
}

void Zero(const Ctx& ctx, float* p, size_t n) {
  cudaMemsetAsync(p, 0, n * sizeof(float), ctx.stream);
}

namespace {
__global__ void ScaleKernel(float* p, size_t n, float s) {
  const size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x;
  if (i < n) p[i] *= s;
}
}  // namespace

void Scale(const Ctx& ctx, float* p, size_t n, float s) {
  if (n == 0) return;
  ScaleKernel<<<Blocks(n), kThreads, 0, ctx.stream>>>(p, n, s);
}

void To16Bit(const Ctx& ctx, cudaDataType_t type, void* out, const float* in,
             size_t n) {
  if (n == 0) return;
  if (type == CUDA_R_16F) {
    LaunchTo16<__half, __half2>(ctx, static_cast<__half*>(out), in, n);
  } else {
    LaunchTo16<__nv_bfloat16, __nv_bfloat162>(
        ctx, static_cast<__nv_bfloat16*>(out), in, n);
  }
}

void FusedClassifier(const Ctx& ctx, float* logits, float* losses,
                     const int* targets, int N, int V, int Vp, float dloss,
                     bool backward, void* rounded) {
  AsOperandType(ctx, rounded, logits, [&](auto* grad) {
    FusedClassifierKernel<<<N, kClassifierThreads, 0, ctx.stream>>>(
        logits, grad, losses, targets, V, Vp, dloss, backward);
  });
}

AdamConstants MakeAdamConstants(double lr, double beta1, double beta2,
                                double eps, double weight_decay, bool adamw,
                                int64_t step, bool decay) {
  const double bc1 = 1.0 - std::pow(beta1, static_cast<double>(step));
  const double bc2 = 1.0 - std::pow(beta2, static_cast<double>(step));
  AdamConstants k{};
  k.b1 = static_cast<float>(beta1);
  k.one_minus_b1 = static_cast<float>(1.0 - beta1);
  k.b2 = static_cast<float>(beta2);
  k.one_minus_b2 = static_cast<float>(1.0 - beta2);
  k.sqrt_bc2 = static_cast<float>(std::sqrt(bc2));
  k.eps = static_cast<float>(eps);
  k.neg_step = static_cast<float>(-lr / bc1);
  k.adamw = adamw;
  k.decay = decay;
  k.decay_mul = adamw ? static_cast<float>(1.0 - lr * weight_decay)
                      : static_cast<float>(weight_decay);
  return k;
}

void AdamStep(const Ctx& ctx, float* params, const float* grads, float* m,
              float* v, size_t n, const AdamConstants& k, float grad_scale) {
  if (n == 0) return;
  AdamKernel<<<Blocks(n), kThreads, 0, ctx.stream>>>(params, grads, m, v, n, k,
                                                     grad_scale);
}

void SquaredSumPartials(const Ctx& ctx, const float* g, size_t n,
                        double* partials) {
  SquaredSumKernel<<<kSquaredSumBlocks, kThreads, 0, ctx.stream>>>(g, n,
                                                                   partials);
}

}  // namespace dslaunch::worker::cuda
