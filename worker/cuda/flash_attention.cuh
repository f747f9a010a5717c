// What the fused attention's kernels share (tiles, shared memory, the
// products on mma fragments, the workspace): flash_forward.cu and
// flash_backward.cu hold the kernels and their launches, flash_attention.cu
// which shapes and GPUs they take. Internal to worker/cuda/.
//
// Fused causal self-attention for the CUDA engine, in the manner of
// FlashAttention-2 (Dao, 2023): the (T, T) scores never reach global
// memory. A block takes 64 rows of one (batch, head), 16 to a warp, and
// walks the 64-wide tiles of the other side up to the diagonal (the masked
// half is never computed). The products run on the tensor cores through
// mma.sync m16n8k16 (bf16 operands, fp32 sums), whose register layouts are
// fixed by the PTX ISA: the scores, the online softmax and the output stay
// in registers, and a score tile's accumulators become the next product's
// bf16 operand without a trip through shared memory. Only the K, V, Q and
// dout tiles pass through shared memory, as bf16 rows copied there by
// cp.async while the block computes on the last tile (two buffers each for
// the tiles a loop walks); where a product needs a tile's columns as
// rows, ldmatrix's .trans reads it so.
//  - Forward: a block per 64 queries keeps each row's running maximum and
//    sum (in base 2) and its output; it writes the output and each row's
//    natural log-sum-exp, as the batched path does.
//  - Backward, without atomics (so the same bits every run): one kernel per
//    64 keys accumulates dK and dV over the query tiles, another per 64
//    queries accumulates dQ over the key tiles; both recompute the
//    probabilities from the log-sum-exp, and D = rowsum(dout * out) comes
//    first from a small kernel.
// Q, K, V, dout, the probabilities and the scores' gradient are rounded to
// bf16 for the products (PyTorch's bf16 SDPA does the same); everything
// else is fp32. Q, K, V and dout are rounded once per pass into the
// workspace (each tile of them is read by many blocks: at 2 bytes an
// element the loads, which bound these kernels, move half the bytes), or
// Q, K and V come so (the engine's qkv product writes them rounded and
// keeps them for the backward pass).
#pragma once

#include <cuda_bf16.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "worker/cuda/kernels_cuda.h"
#include "worker/cuda/launch.cuh"
#include "worker/cuda/mma.cuh"

namespace dslaunch::worker::cuda::flash {

constexpr int kWarps = 4;  // a block's warps, 16 rows each
constexpr int kThreads = 32 * kWarps;
constexpr int kTile = 16 * kWarps;  // rows of a block; columns of a tile
constexpr int kCols = kTile / 8;    // a tile's 8-wide pieces (mma's n)
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;
// Row strides in shared memory, in bf16: 8 more than the row, so that the
// 8 rows x 4 pairs an operand load touches fall in 32 different banks (and
// every row starts 16-byte aligned, for cp.async and ldmatrix).
template <int HS>
constexpr int kLd = HS + 8;  // (kTile, HS) tiles, a row per token

template <int HS>
constexpr size_t TileBytes() {
  return kTile * kLd<HS> * sizeof(bf16);
}

// acc (16 x kTile) = rows row0.. of a (HS wide) x rows of b (kTile, HS)^T.
template <int HS>
__device__ inline void RowsTimesRowsT(float (*acc)[4], const bf16* a, int row0,
                                      const bf16* b, Lane l) {
#pragma unroll
  for (int n = 0; n < kCols; ++n)
#pragma unroll
    for (int i = 0; i < 4; ++i) acc[n][i] = 0.0f;
#pragma unroll
  for (int kk = 0; kk < HS / 16; ++kk) {
    uint32_t fa[4];
    LoadA(fa, a, kLd<HS>, row0, kk * 16, l);
#pragma unroll
    for (int n = 0; n < kCols; ++n) {
      uint32_t fb[2];
      LoadB(fb, b, kLd<HS>, n * 8, kk * 16, l);
      Mma(acc[n], fa, fb);
    }
  }
}

// acc (16 x HS) += p (16 x kTile, accumulators) x the (kTile, HS) tile m.
template <int HS>
__device__ inline void AccumulateTimes(float (*acc)[4], const float (*p)[4],
                                       const bf16* m) {
#pragma unroll
  for (int j = 0; j < kTile / 16; ++j) {
    uint32_t fa[4];
    AccToA(fa, p[2 * j], p[2 * j + 1]);
#pragma unroll
    for (int dn = 0; dn < HS / 8; ++dn) {
      uint32_t fb[2];
      LoadBTrans(fb, m, kLd<HS>, j * 16, dn * 8);
      Mma(acc[dn], fa, fb);
    }
  }
}

// Starts copying rows row0..row0+kTile-1 (zeros past T) of the HS columns
// at src of a (T, width) bf16 matrix (staged by Stage: src and every row
// 16-byte aligned) into `rows` (kTile, HS), 16 bytes a thread at a time.
template <int HS>
__device__ void LoadTile(bf16* rows, const bf16* src, size_t width, int row0,
                         int T) {
  constexpr int kOcts = HS / 8;
  for (int i = threadIdx.x; i < kTile * kOcts; i += kThreads) {
    const int r = i / kOcts, d = 8 * (i % kOcts);
    const bool in = row0 + r < T;  // else row 0, not read
    CopyAsync(rows + r * kLd<HS> + d,
              src + static_cast<size_t>(in ? row0 + r : 0) * width + d,
              in ? 16 : 0);
  }
}

// Shared memory carved in 128-byte aligned pieces.
__host__ __device__ constexpr size_t Align(size_t bytes) {
  return (bytes + 127) / 128 * 128;
}
struct Carver {
  unsigned char* at;
  template <typename X>
  __device__ X* Take(size_t n) {
    X* p = reinterpret_cast<X*>(at);
    at += Align(n * sizeof(X));
    return p;
  }
};

// dst (row, col0 + the lane's columns) += acc (= acc without add) for the
// two rows of each 8-wide piece that are below T; rows row0.. of a
// (T, width) matrix.
template <int HS>
__device__ void AddRows(float* dst, size_t width, int row0, int T,
                        const float (*acc)[4], bool add, Lane l) {
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int row = row0 + l.g + 8 * half;
    if (row >= T) continue;
    float* at = dst + static_cast<size_t>(row) * width + 2 * l.t;
#pragma unroll
    for (int dn = 0; dn < HS / 8; ++dn) {
      const float x = acc[dn][2 * half], y = acc[dn][2 * half + 1];
      at[dn * 8] = add ? at[dn * 8] + x : x;
      at[dn * 8 + 1] = add ? at[dn * 8 + 1] + y : y;
    }
  }
}

// A tile's elements in shared memory (every tile a multiple of 128 bytes).
template <int HS>
constexpr int kTileElems = kTile* kLd<HS>;

// The loop's step between tiles: the next tile's copies started (more) or
// none left; waits until this one's have landed, for every thread.
__device__ inline void AwaitTile(bool more) {
  if (more) {
    CopyCommit();
    CopyWait<1>();
  } else {
    CopyWait<0>();
  }
  __syncthreads();
}

// Starts copying key tile kt's K and V (qkv rows at base, (T, 3C)) into
// buffer kt % 2 of kbuf and vbuf.
template <int HS>
__device__ __forceinline__ void LoadKeysValues(bf16* kbuf, bf16* vbuf,
                                               const bf16* base, int C, int kt,
                                               int T) {
  const int at = (kt & 1) * kTileElems<HS>;
  LoadTile<HS>(kbuf + at, base + C, 3 * C, kt * kTile, T);
  LoadTile<HS>(vbuf + at, base + 2 * C, 3 * C, kt * kTile, T);
}

template <int HS>
constexpr size_t ForwardSmem() {  // Q; K and V twice
  return 5 * Align(TileBytes<HS>());
}

// Both backward kernels' shared memory.
template <int HS>
constexpr size_t BackwardKvSmem() {  // K, V; Q, dout and 2 x kTile floats twice
  return 6 * Align(TileBytes<HS>()) + 2 * Align(2 * kTile * sizeof(float));
}
template <int HS>
constexpr size_t BackwardQSmem() {  // Q, dout; K and V twice
  return 6 * Align(TileBytes<HS>());
}

// Lets `kernel` take `bytes` of shared memory: once per kernel and process
// (a process drives one GPU), not on every launch.
// (The kernel is a template argument: kernels of one signature share a
// type, and each needs its own call.)
template <auto kernel>
cudaError_t AllowSmem(size_t bytes) {
  static const cudaError_t once =
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                           static_cast<int>(bytes));
  return once;
}

// The workspace is there and 16-byte aligned (the staged rows' copies).
inline bool Aligned(const float* workspace) {
  return workspace != nullptr &&
         reinterpret_cast<uintptr_t>(workspace) % 16 == 0;
}

// The workspace: D (B * NH * T floats, padded to 16 bytes), then the
// staged bf16 inputs, dout (B, T, C) and, unless they come rounded, qkv
// (B, T, 3C) (C is a multiple of 16: each starts 16-byte aligned).
inline size_t DdFloats(int B, int T, int NH) {
  return (static_cast<size_t>(B) * NH * T + 3) / 4 * 4;
}
inline bf16* StagedDout(float* workspace, int B, int T, int NH) {
  return reinterpret_cast<bf16*>(workspace + DdFloats(B, T, NH));
}
inline bf16* StagedQkv(float* workspace, int B, int T, int C, int NH) {
  return StagedDout(workspace, B, T, NH) + static_cast<size_t>(B) * T * C;
}
// Q, K and V rounded to bf16 (what the kernels would round them to on every
// load, once: the same bits) at the staging place, or as they come rounded
// (qkv16); null where qkv16 is not 16-byte aligned or there is neither.
inline const bf16* Stage(const Ctx& ctx, float* workspace, const float* inp,
                         const void* qkv16, int B, int T, int C, int NH) {
  if (qkv16 != nullptr) {
    return reinterpret_cast<uintptr_t>(qkv16) % 16 == 0
               ? static_cast<const bf16*>(qkv16)
               : nullptr;
  }
  if (inp == nullptr) return nullptr;
  bf16* qkv = StagedQkv(workspace, B, T, C, NH);
  To16Bit(ctx, CUDA_R_16BF, qkv, inp, static_cast<size_t>(B) * T * 3 * C);
  return qkv;
}

// f(std::integral_constant<int, HS>()) for a head size HS the kernels
// take, else `otherwise`.
template <typename R, typename F>
R ByHeadSize(int hs, R otherwise, const F& f) {
  switch (hs) {
    case 16:
      return f(std::integral_constant<int, 16>());
    case 32:
      return f(std::integral_constant<int, 32>());
    case 64:
      return f(std::integral_constant<int, 64>());
    case 128:
      return f(std::integral_constant<int, 128>());
  }
  return otherwise;
}

template <int HS>
constexpr size_t MostSmem() {
  return std::max(
      {ForwardSmem<HS>(), BackwardKvSmem<HS>(), BackwardQSmem<HS>()});
}

}  // namespace dslaunch::worker::cuda::flash
