// AdamW, the gradients' squared sums and their scaling on the GPU;
// declared in kernels_cuda.h.
#include <cmath>
#include <cstdint>

#include "worker/cuda/kernels_cuda.h"
#include "worker/cuda/launch.cuh"

namespace dslaunch::worker::cuda {
namespace {

using namespace launch;  // NOLINT: kThreads, Blocks

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

__global__ void ScaleKernel(float* p, size_t n, float s) {
  const size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x;
  if (i < n) p[i] *= s;
}
}  // namespace

void Scale(const Ctx& ctx, float* p, size_t n, float s) {
  if (n == 0) return;
  ScaleKernel<<<Blocks(n), kThreads, 0, ctx.stream>>>(p, n, s);
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
