// Causal self-attention for the CUDA engine: heads split out of the qkv
// activation, scores and outputs by strided-batched cuBLAS products, and
// softmax kernels that keep each row's log-sum-exp for the backward pass.
#include <cmath>

#include "worker/cuda/kernels_cuda.h"
#include "worker/cuda/launch.cuh"

namespace dslaunch::worker::cuda {
namespace {

using namespace launch;  // NOLINT: kThreads, Blocks, WarpSum, ...

// ------------------------------------------------------------ attention

// Element i of a (B, NH, T, hs) head tensor: where it sits in a (B, T,
// `width`) row-major tensor whose head h starts at column h * hs (width C
// for an activation, 3C for the qkv one, whose q part comes first).
__device__ size_t FlatIndex(size_t i, int T, int NH, int hs, int width) {
  const size_t d = i % hs, t = (i / hs) % T, h = (i / (hs * size_t(T))) % NH;
  const size_t b = i / (hs * size_t(T) * NH);
  return (b * T + t) * width + h * hs + d;
}

// inp (B, T, 3C) -> q, k, v, each (B, NH, T, hs).
__global__ void SplitHeadsKernel(float* q, float* k, float* v, const float* inp,
                                 int B, int T, int NH, int hs) {
  const size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x;
  const int C = NH * hs;
  if (i >= static_cast<size_t>(B) * T * C) return;
  const size_t src = FlatIndex(i, T, NH, hs, 3 * C);
  q[i] = inp[src];
  k[i] = inp[src + C];
  v[i] = inp[src + 2 * C];
}

// x (B, T, C) <-> y (B, NH, T, hs); to_heads picks the direction.
__global__ void HeadsKernel(float* heads, float* flat, int B, int T, int NH,
                            int hs, bool to_heads) {
  const size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x;
  const int C = NH * hs;
  if (i >= static_cast<size_t>(B) * T * C) return;
  const size_t j = FlatIndex(i, T, NH, hs, C);
  if (to_heads) {
    heads[i] = flat[j];
  } else {
    flat[j] = heads[i];
  }
}

// dinp (B, T, 3C) += dq, dk, dv (B, NH, T, hs) (= without add).
__global__ void MergeHeadGradsKernel(float* dinp, const float* dq,
                                     const float* dk, const float* dv, int B,
                                     int T, int NH, int hs, bool add) {
  const size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x;
  const int C = NH * hs;
  if (i >= static_cast<size_t>(B) * T * C) return;
  const size_t dst = FlatIndex(i, T, NH, hs, 3 * C);
  dinp[dst] = add ? dinp[dst] + dq[i] : dq[i];
  dinp[dst + C] = add ? dinp[dst + C] + dk[i] : dk[i];
  dinp[dst + 2 * C] = add ? dinp[dst + 2 * C] + dv[i] : dv[i];
}

// One warp per row r = bh * T + i of the (rows, T) scores (already scaled):
// P = causal softmax written in place (0 past the diagonal), lse[r] its
// log-sum-exp.
__global__ void CausalSoftmaxKernel(float* s, float* lse, int rows, int T) {
  const int r = blockIdx.x * (blockDim.x / kWarp) + threadIdx.x / kWarp;
  const int lane = threadIdx.x % kWarp;
  if (r >= rows) return;
  const int i = r % T;
  float* x = s + static_cast<size_t>(r) * T;
  float m = -INFINITY;
  for (int j = lane; j <= i; j += kWarp) m = fmaxf(m, x[j]);
  m = WarpMax(m);
  float sum = 0;
  for (int j = lane; j <= i; j += kWarp) sum += expf(x[j] - m);
  sum = WarpSum(sum);
  const float inv = 1.0f / sum;
  for (int j = lane; j < T; j += kWarp)
    x[j] = j <= i ? expf(x[j] - m) * inv : 0.0f;
  if (lane == 0) lse[r] = m + logf(sum);
}

// P = exp(S - lse) in place, 0 past the diagonal.
__global__ void CausalProbsKernel(float* s, const float* lse, int rows, int T) {
  const int r = blockIdx.x * (blockDim.x / kWarp) + threadIdx.x / kWarp;
  const int lane = threadIdx.x % kWarp;
  if (r >= rows) return;
  const int i = r % T;
  float* x = s + static_cast<size_t>(r) * T;
  const float l = lse[r];
  for (int j = lane; j < T; j += kWarp) x[j] = j <= i ? expf(x[j] - l) : 0.0f;
}

// dP -> dS = P * (dP - sum_j P dP) in place, 0 past the diagonal.
__global__ void CausalSoftmaxBackwardKernel(float* dp, const float* p, int rows,
                                            int T) {
  const int r = blockIdx.x * (blockDim.x / kWarp) + threadIdx.x / kWarp;
  const int lane = threadIdx.x % kWarp;
  if (r >= rows) return;
  const int i = r % T;
  float* g = dp + static_cast<size_t>(r) * T;
  const float* x = p + static_cast<size_t>(r) * T;
  float d = 0;
  for (int j = lane; j <= i; j += kWarp) d += x[j] * g[j];
  d = WarpSum(d);
  for (int j = lane; j < T; j += kWarp)
    g[j] = j <= i ? x[j] * (g[j] - d) : 0.0f;
}

}  // namespace

cublasStatus_t RowGemmBatched(const Ctx& ctx, bool trans_a, bool trans_b, int M,
                              int N, int K, float alpha, const float* A,
                              int lda, long long stride_a, const float* B,
                              int ldb, long long stride_b, float beta, float* C,
                              int ldc, long long stride_c, int batch) {
  return cublasGemmStridedBatchedEx(
      ctx.blas, trans_b ? CUBLAS_OP_T : CUBLAS_OP_N,
      trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, N, M, K, &alpha, B, CUDA_R_32F, ldb,
      stride_b, A, CUDA_R_32F, lda, stride_a, &beta, C, CUDA_R_32F, ldc,
      stride_c, batch, ctx.batched_compute, CUBLAS_GEMM_DEFAULT);
}

bool AttentionFused(const Ctx& ctx, int B, int C, int NH) {
  return ctx.fused_attention && FlashAttentionShape(B, C, NH);
}

size_t AttentionWorkspaceFloats(const Ctx& ctx, int B, int T, int C, int NH,
                                bool qkv16) {
  if (AttentionFused(ctx, B, C, NH))
    return FlashAttentionWorkspaceFloats(B, T, C, NH, qkv16);
  const size_t btc = static_cast<size_t>(B) * T * C;
  const size_t scores = static_cast<size_t>(B) * NH * T * T;
  return 7 * btc + 2 * scores;
}

cublasStatus_t AttentionForward(const Ctx& ctx, float* out, float* lse,
                                const float* inp, int B, int T, int C, int NH,
                                float* workspace, void* out16,
                                const void* qkv16) {
  if (AttentionFused(ctx, B, C, NH)) {
    return FlashAttentionForward(ctx, out, lse, inp, B, T, C, NH, workspace,
                                 out16, qkv16) == cudaSuccess
               ? CUBLAS_STATUS_SUCCESS
               : CUBLAS_STATUS_EXECUTION_FAILED;
  }
  if (qkv16 != nullptr || inp == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
  const int hs = C / NH;
  const size_t btc = static_cast<size_t>(B) * T * C;
  float *q = workspace, *k = q + btc, *v = k + btc, *y = v + btc;
  float* s = y + btc;
  const int rows = B * NH * T;
  const long long th = static_cast<long long>(T) * hs;
  const long long tt = static_cast<long long>(T) * T;
  SplitHeadsKernel<<<Blocks(btc), kThreads, 0, ctx.stream>>>(q, k, v, inp, B, T,
                                                             NH, hs);
  cublasStatus_t st =
      RowGemmBatched(ctx, false, true, T, T, hs, 1.0f / sqrtf(hs), q, hs, th, k,
                     hs, th, 0.0f, s, T, tt, B * NH);
  if (st != CUBLAS_STATUS_SUCCESS) return st;
  CausalSoftmaxKernel<<<WarpRowBlocks(rows), kThreads, 0, ctx.stream>>>(
      s, lse, rows, T);
  st = RowGemmBatched(ctx, false, false, T, hs, T, 1.0f, s, T, tt, v, hs, th,
                      0.0f, y, hs, th, B * NH);
  if (st != CUBLAS_STATUS_SUCCESS) return st;
  HeadsKernel<<<Blocks(btc), kThreads, 0, ctx.stream>>>(y, out, B, T, NH, hs,
                                                        false);
  if (out16 != nullptr && ctx.operands != CUDA_R_32F)
    To16Bit(ctx, ctx.operands, out16, out, btc);
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t AttentionBackward(const Ctx& ctx, float* dinp, const float* dout,
                                 const float* inp, const float* out,
                                 const float* lse, int B, int T, int C, int NH,
                                 float* workspace, bool add,
                                 const void* qkv16) {
  if (AttentionFused(ctx, B, C, NH)) {
    return FlashAttentionBackward(ctx, dinp, dout, inp, out, lse, B, T, C, NH,
                                  workspace, add, qkv16) == cudaSuccess
               ? CUBLAS_STATUS_SUCCESS
               : CUBLAS_STATUS_EXECUTION_FAILED;
  }
  if (qkv16 != nullptr || inp == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
  const int hs = C / NH;
  const size_t btc = static_cast<size_t>(B) * T * C;
  float *q = workspace, *k = q + btc, *v = k + btc, *dy = v + btc;
  float *dq = dy + btc, *dk = dq + btc, *dv = dk + btc;
  const size_t scores = static_cast<size_t>(B) * NH * T * T;
  float *p = dv + btc, *dp = p + scores;
  const int rows = B * NH * T, batch = B * NH;
  const long long th = static_cast<long long>(T) * hs;
  const long long tt = static_cast<long long>(T) * T;
  const float scale = 1.0f / sqrtf(hs);
  SplitHeadsKernel<<<Blocks(btc), kThreads, 0, ctx.stream>>>(q, k, v, inp, B, T,
                                                             NH, hs);
  HeadsKernel<<<Blocks(btc), kThreads, 0, ctx.stream>>>(
      dy, const_cast<float*>(dout), B, T, NH, hs, true);
  cublasStatus_t st = RowGemmBatched(ctx, false, true, T, T, hs, scale, q, hs,
                                     th, k, hs, th, 0.0f, p, T, tt, batch);
  if (st != CUBLAS_STATUS_SUCCESS) return st;
  CausalProbsKernel<<<WarpRowBlocks(rows), kThreads, 0, ctx.stream>>>(p, lse,
                                                                      rows, T);
  // dv = P^T dy, dP = dy v^T
  st = RowGemmBatched(ctx, true, false, T, hs, T, 1.0f, p, T, tt, dy, hs, th,
                      0.0f, dv, hs, th, batch);
  if (st != CUBLAS_STATUS_SUCCESS) return st;
  st = RowGemmBatched(ctx, false, true, T, T, hs, 1.0f, dy, hs, th, v, hs, th,
                      0.0f, dp, T, tt, batch);
  if (st != CUBLAS_STATUS_SUCCESS) return st;
  CausalSoftmaxBackwardKernel<<<WarpRowBlocks(rows), kThreads, 0, ctx.stream>>>(
      dp, p, rows, T);
  // dq = scale dS k, dk = scale dS^T q
  st = RowGemmBatched(ctx, false, false, T, hs, T, scale, dp, T, tt, k, hs, th,
                      0.0f, dq, hs, th, batch);
  if (st != CUBLAS_STATUS_SUCCESS) return st;
  st = RowGemmBatched(ctx, true, false, T, hs, T, scale, dp, T, tt, q, hs, th,
                      0.0f, dk, hs, th, batch);
  if (st != CUBLAS_STATUS_SUCCESS) return st;
  MergeHeadGradsKernel<<<Blocks(btc), kThreads, 0, ctx.stream>>>(
      dinp, dq, dk, dv, B, T, NH, hs, add);
  return CUBLAS_STATUS_SUCCESS;
}

}  // namespace dslaunch::worker::cuda
