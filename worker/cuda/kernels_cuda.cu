// The model's pointwise, normalisation, embedding and classifier kernels
// (the products: matmul_cuda.cu; the optimizer: optimizer_cuda.cu;
// attention: attention_cuda.cu, flash_*.cu); declared in
// kernels_cuda.h.
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
// Four at once (p aligned to four elements).
__device__ inline void Put4(float* p, float4 v) {
  *reinterpret_cast<float4*>(p) = v;
}
__device__ inline void Put4(__nv_bfloat16* p, float4 v) {
  auto* q = reinterpret_cast<__nv_bfloat162*>(p);
  q[0] = Round2<__nv_bfloat162>(v.x, v.y);
  q[1] = Round2<__nv_bfloat162>(v.z, v.w);
}
__device__ inline void Put4(__half* p, float4 v) {
  auto* q = reinterpret_cast<__half2*>(p);
  q[0] = Round2<__half2>(v.x, v.y);
  q[1] = Round2<__half2>(v.z, v.w);
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
// 16-bit copy for the head's products. Where rows are 16-byte aligned
// (Vp a multiple of 4), a thread takes four columns at a time: a 16-byte
// load and one rescaling of its running sum for four columns, a quarter of
// the loop's trips.
constexpr int kClassifierThreads = 1024;

// The online max m and sum s (of exp(x - m)) taking x.
__device__ inline void OnlineAdd(float& m, float& s, float x) {
  if (x > m) {
    s = s * expf(m - x) + 1.0f;
    m = x;
  } else {
    s += expf(x - m);
  }
}

// The same taking four values at once.
__device__ inline void OnlineAdd4(float& m, float& s, float4 v) {
  const float mx = fmaxf(fmaxf(v.x, v.y), fmaxf(v.z, v.w));
  const float mn = fmaxf(m, mx);
  s = (m == -INFINITY ? 0.0f : s * expf(m - mn)) +
      ((expf(v.x - mn) + expf(v.y - mn)) + (expf(v.z - mn) + expf(v.w - mn)));
  m = mn;
}

// dloss * (softmax - onehot) of column j given the row's log-sum-exp (0
// past V).
__device__ inline float ClassifierGrad(float x, int j, int V, int target,
                                       float lse, float dloss) {
  if (j >= V) return 0.0f;
  return dloss * (expf(x - lse) - (j == target ? 1.0f : 0.0f));
}

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
  // Four columns at a time up to the last whole four of V, then one, where
  // every row starts aligned to four (the sum's order then depends on the
  // logits alone); the gradient four at a time where its rows are too.
  const bool by4 = Vp % 4 == 0 && reinterpret_cast<uintptr_t>(logits) % 16 == 0;
  const bool write4 =
      by4 && reinterpret_cast<uintptr_t>(grad) % (4 * sizeof(G)) == 0;
  const auto* x4 = reinterpret_cast<const float4*>(x);
  const int whole4 = by4 ? V / 4 : 0;
  float m = -INFINITY, s = 0;
  for (int q = threadIdx.x; q < whole4; q += blockDim.x)
    OnlineAdd4(m, s, x4[q]);
  for (int j = 4 * whole4 + threadIdx.x; j < V; j += blockDim.x)
    OnlineAdd(m, s, x[j]);
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
  if (write4) {
    for (int q = threadIdx.x; q < Vp / 4; q += blockDim.x) {
      const float4 v = x4[q];
      const int j = 4 * q;
      Put4(out + j,
           make_float4(ClassifierGrad(v.x, j, V, target, lse, dloss),
                       ClassifierGrad(v.y, j + 1, V, target, lse, dloss),
                       ClassifierGrad(v.z, j + 2, V, target, lse, dloss),
                       ClassifierGrad(v.w, j + 3, V, target, lse, dloss)));
    }
    return;
  }
  for (int j = threadIdx.x; j < Vp; j += blockDim.x)
    Put(out + j, ClassifierGrad(x[j], j, V, target, lse, dloss));
}

}  // namespace

// ------------------------------------------------------------ host side

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

void BiasGradient(const Ctx& ctx, float* dbias, const float* dout, int N, int C,
                  float* scratch, void* rounded) {
  ColumnSums(ctx, nullptr, dbias, dout, nullptr, nullptr, nullptr, N, C,
             scratch, rounded);
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

}  // namespace dslaunch::worker::cuda
