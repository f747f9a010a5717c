// The tensor cores' building blocks for the fused attention
// (flash_attention.cuh), as the PTX ISA fixes them: mma.sync m16n8k16 on
// bf16 operands with fp32 sums and its register layouts, the operands'
// loads from shared memory (ldmatrix .trans for a tile read transposed),
// and cp.async copies from global to shared memory. sm_80 and later.
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

namespace dslaunch::worker::cuda {

using bf16 = __nv_bfloat16;

// A lane's place in mma's layouts: group g (lane / 4) owns rows g and g + 8
// of a 16-row piece; t (lane % 4) owns columns 2t, 2t + 1 of each 8.
struct Lane {
  int g, t;
  __device__ Lane() : g((threadIdx.x % 32) / 4), t(threadIdx.x % 4) {}
};

__device__ inline uint32_t Pack(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&v);
}

__device__ inline uint32_t Pair(const bf16* p) {
  return *reinterpret_cast<const uint32_t*>(p);
}

// c (16 x 8, fp32) += a (16 x 16, bf16, row-major) * b (16 x 8, bf16).
__device__ inline void Mma(float* c, const uint32_t* a, const uint32_t* b) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
      "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

// The A operand: rows row0..row0+15, columns k0..k0+15 of a row-major tile.
__device__ inline void LoadA(uint32_t* a, const bf16* tile, int ld, int row0,
                             int k0, Lane l) {
  const bf16* p = tile + (row0 + l.g) * ld + k0 + 2 * l.t;
  a[0] = Pair(p);
  a[1] = Pair(p + 8 * ld);
  a[2] = Pair(p + 8);
  a[3] = Pair(p + 8 * ld + 8);
}

// The B operand (k 16 x n 8) from a tile holding it as rows n, columns k:
// rows n0..n0+7, columns k0..k0+15.
__device__ inline void LoadB(uint32_t* b, const bf16* tile, int ld, int n0,
                             int k0, Lane l) {
  const bf16* p = tile + (n0 + l.g) * ld + k0 + 2 * l.t;
  b[0] = Pair(p);
  b[1] = Pair(p + 8);
}

// The B operand (k 16 x n 8) from a tile holding it as rows k, columns n:
// rows k0..k0+15, columns n0..n0+7, through ldmatrix .trans (lanes 0-7
// address rows k0.. of the first 8x8 matrix, lanes 8-15 rows k0+8.. of
// the second; each lane receives (2t, g), (2t+1, g) of each, as LoadB's).
__device__ inline void LoadBTrans(uint32_t* b, const bf16* tile, int ld, int k0,
                                  int n0) {
  const int lane = threadIdx.x % 32;
  const bf16* p = tile + (k0 + lane % 16) * ld + n0;
  const auto at = static_cast<uint32_t>(__cvta_generic_to_shared(p));
  asm volatile(
      "ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0, %1}, [%2];\n"
      : "=r"(b[0]), "=r"(b[1])
      : "r"(at));
}

// Two 8-wide accumulator pieces (columns 16j..16j+15) as the A operand of
// the next product, rounded to bf16.
__device__ inline void AccToA(uint32_t* a, const float* lo, const float* hi) {
  a[0] = Pack(lo[0], lo[1]);
  a[1] = Pack(lo[2], lo[3]);
  a[2] = Pack(hi[0], hi[1]);
  a[3] = Pack(hi[2], hi[3]);
}

// cp.async: 16 bytes from global to shared memory, bypassing L1; with
// `bytes` 0 nothing is read and zeros land.
__device__ inline void CopyAsync(void* dst, const void* src, int bytes) {
  const auto at = static_cast<uint32_t>(__cvta_generic_to_shared(dst));
  const size_t from = __cvta_generic_to_global(src);
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(at),
               "l"(from), "r"(bytes)
               : "memory");
}
// The copies started since the last commit, as one group.
__device__ inline void CopyCommit() {
  asm volatile("cp.async.commit_group;\n" ::: "memory");
}
// Waits until at most `pending` groups of this thread's are still running
// (its own copies only: a __syncthreads after shows every thread's).
template <int pending>
__device__ inline void CopyWait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(pending) : "memory");
}

}  // namespace dslaunch::worker::cuda
