// What the CUDA engine's kernel files share (kernels_cuda.cu,
// matmul_cuda.cu, optimizer_cuda.cu, attention_cuda.cu, flash_*.cu):
// launch shapes and warp reductions. Internal to libdsl_cuda.
#pragma once

#include <cstddef>

namespace dslaunch::worker::cuda::launch {

inline constexpr int kThreads = 256;
inline constexpr int kWarp = 32;

inline unsigned Blocks(size_t n, int threads = kThreads) {
  return static_cast<unsigned>((n + threads - 1) / threads);
}

__device__ inline float WarpSum(float x) {
  for (int o = kWarp / 2; o > 0; o /= 2) x += __shfl_xor_sync(0xffffffff, x, o);
  return x;
}

__device__ inline float WarpMax(float x) {
  for (int o = kWarp / 2; o > 0; o /= 2)
    x = fmaxf(x, __shfl_xor_sync(0xffffffff, x, o));
  return x;
}

// Blocks of kThreads for one warp per row.
inline unsigned WarpRowBlocks(int rows) {
  const int per_block = kThreads / kWarp;
  return static_cast<unsigned>((rows + per_block - 1) / per_block);
}

}  // namespace dslaunch::worker::cuda::launch
