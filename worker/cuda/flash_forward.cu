// The fused attention's forward pass (flash_attention.cuh has the
// design): a block per 64 queries of one (batch, head).
#include <cuda_fp16.h>

#include <cmath>

#include "worker/cuda/flash_attention.cuh"

namespace dslaunch::worker::cuda {
namespace flash {
namespace {

// The online softmax over a warp's 16 x kTile score tile s (keys from k0):
// rows g (i 0, 1) and g + 8 (i 2, 3), each spread over the 4 lanes of a
// group. s becomes the tile's probabilities (base 2, unnormalised), and
// each row's running maximum m, sum and output o are rescaled. kMasked:
// keys past a row's query count as -infinity (the diagonal tile's).
template <int HS, bool kMasked>
__device__ inline void OnlineSoftmax(float (*s)[4], float (*o)[4], float* m,
                                     float* sum, int k0, const int* query,
                                     float s2, Lane l) {
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    float mx = -INFINITY;
#pragma unroll
    for (int n = 0; n < kCols; ++n)
#pragma unroll
      for (int i = 2 * half; i < 2 * half + 2; ++i) {
        const int key = k0 + n * 8 + 2 * l.t + (i & 1);
        const float x =
            !kMasked || key <= query[half] ? s[n][i] * s2 : -INFINITY;
        s[n][i] = x;
        mx = fmaxf(mx, x);
      }
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffff, mx, 1));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffff, mx, 2));
    const float m_new = fmaxf(m[half], mx);  // finite: key 0 is in tile 0
    const float alpha = exp2f(m[half] - m_new);
    float add = 0.0f;
#pragma unroll
    for (int n = 0; n < kCols; ++n)
#pragma unroll
      for (int i = 2 * half; i < 2 * half + 2; ++i) {
        s[n][i] = exp2f(s[n][i] - m_new);
        add += s[n][i];
      }
    add += __shfl_xor_sync(0xffffffff, add, 1);
    add += __shfl_xor_sync(0xffffffff, add, 2);
    sum[half] = sum[half] * alpha + add;
    m[half] = m_new;
#pragma unroll
    for (int dn = 0; dn < HS / 8; ++dn) {
      o[dn][2 * half] *= alpha;
      o[dn][2 * half + 1] *= alpha;
    }
  }
}

// Grid (query tiles, B * NH), the longest rows first. inp: (B, T, 3C).
// out16: null, or out again rounded to bf16 (fp16 with fp16) there.
template <int HS>
__global__ void __launch_bounds__(kThreads)
    FlashForwardKernel(float* out, float* lse, const bf16* inp, int T, int NH,
                       float scale, void* out16, bool fp16) {
  extern __shared__ __align__(128) unsigned char smem[];
  const int C = NH * HS, bh = blockIdx.y, b = bh / NH, h = bh % NH;
  const int qt = gridDim.x - 1 - blockIdx.x, q0 = qt * kTile;
  const int warp = threadIdx.x / 32, row0 = warp * 16;
  const Lane l;
  Carver cv{smem};
  bf16* qs = cv.Take<bf16>(kTileElems<HS>);
  bf16* kbuf = cv.Take<bf16>(2 * kTileElems<HS>);
  bf16* vbuf = cv.Take<bf16>(2 * kTileElems<HS>);
  const bf16* base = inp + static_cast<size_t>(b) * T * 3 * C + h * HS;
  LoadTile<HS>(qs, base, 3 * C, q0, T);
  LoadKeysValues<HS>(kbuf, vbuf, base, C, 0, T);
  CopyCommit();
  const float s2 = scale * kLog2e;  // scores to base-2 exponents
  const int query[2] = {q0 + row0 + l.g, q0 + row0 + l.g + 8};
  float o[HS / 8][4] = {};
  float m[2] = {-INFINITY, -INFINITY}, sum[2] = {0.0f, 0.0f};
  for (int kt = 0; kt <= qt; ++kt) {
    const int k0 = kt * kTile;
    if (kt < qt) LoadKeysValues<HS>(kbuf, vbuf, base, C, kt + 1, T);
    AwaitTile(kt < qt);
    const bf16* ks = kbuf + (kt & 1) * kTileElems<HS>;
    const bf16* vs = vbuf + (kt & 1) * kTileElems<HS>;
    float s[kCols][4];
    RowsTimesRowsT<HS>(s, qs, row0, ks, l);
    // Only the diagonal tile holds keys past a row's query.
    if (kt == qt) {
      OnlineSoftmax<HS, true>(s, o, m, sum, k0, query, s2, l);
    } else {
      OnlineSoftmax<HS, false>(s, o, m, sum, k0, query, s2, l);
    }
    AccumulateTimes<HS>(o, s, vs);
    __syncthreads();  // buffer kt % 2 is free for tile kt + 2
  }
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const float inv = 1.0f / sum[half];
#pragma unroll
    for (int dn = 0; dn < HS / 8; ++dn) {
      o[dn][2 * half] *= inv;
      o[dn][2 * half + 1] *= inv;
    }
    if (l.t == 0 && query[half] < T)
      lse[static_cast<size_t>(bh) * T + query[half]] =
          (m[half] + log2f(sum[half])) * kLn2;
  }
  const size_t first = static_cast<size_t>(b) * T * C + h * HS;
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    if (query[i] >= T) continue;
    const size_t row = first + static_cast<size_t>(query[i]) * C + 2 * l.t;
#pragma unroll
    for (int dn = 0; dn < HS / 8; ++dn) {
      const float x = o[dn][2 * i], y = o[dn][2 * i + 1];
      out[row + dn * 8] = x;
      out[row + dn * 8 + 1] = y;
      if (out16 == nullptr) continue;
      // Two adjacent columns (row + 2t is even): one 4-byte store.
      if (fp16) {
        *reinterpret_cast<__half2*>(static_cast<__half*>(out16) + row +
                                    dn * 8) = __floats2half2_rn(x, y);
      } else {
        *reinterpret_cast<__nv_bfloat162*>(static_cast<bf16*>(out16) + row +
                                           dn * 8) =
            __floats2bfloat162_rn(x, y);
      }
    }
  }
}

template <int HS>
cudaError_t Forward(const Ctx& ctx, float* out, float* lse, const float* inp,
                    int B, int T, int NH, void* out16, float* workspace,
                    const void* qkv16) {
  if (!Aligned(workspace)) return cudaErrorInvalidValue;
  constexpr size_t smem = ForwardSmem<HS>();
  cudaError_t e = AllowSmem<FlashForwardKernel<HS>>(smem);
  if (e != cudaSuccess) return e;
  const bf16* qkv = Stage(ctx, workspace, inp, qkv16, B, T, NH * HS, NH);
  if (qkv == nullptr) return cudaErrorInvalidValue;
  const dim3 grid((T + kTile - 1) / kTile, B * NH);
  FlashForwardKernel<HS><<<grid, kThreads, smem, ctx.stream>>>(
      out, lse, qkv, T, NH, 1.0f / sqrtf(static_cast<float>(HS)),
      ctx.operands == CUDA_R_32F ? nullptr : out16, ctx.operands == CUDA_R_16F);
  return cudaGetLastError();
}

}  // namespace
}  // namespace flash

cudaError_t FlashAttentionForward(const Ctx& ctx, float* out, float* lse,
                                  const float* inp, int B, int T, int C, int NH,
                                  float* workspace, void* out16,
                                  const void* qkv16) {
  return flash::ByHeadSize(C / NH, cudaErrorInvalidValue, [&](auto hs) {
    return flash::Forward<decltype(hs)::value>(ctx, out, lse, inp, B, T, NH,
                                               out16, workspace, qkv16);
  });
}

}  // namespace dslaunch::worker::cuda
