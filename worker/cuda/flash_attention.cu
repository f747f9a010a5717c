// Fused causal self-attention for the CUDA engine, in the manner of
// FlashAttention-2 (Dao, 2023): the (T, T) scores never reach global
// memory. A block takes 64 rows of one (batch, head) and walks the 64-wide
// tiles of the other side up to the diagonal (the masked half is never
// computed), with the products on the tensor cores (WMMA, bf16 operands,
// fp32 sums) and the softmax in fp32 through shared memory.
//  - Forward: a block per 64 queries keeps the running row maximum and sum
//    (the online softmax) and the output rows in shared memory; it writes
//    the output and each row's log-sum-exp, as the batched path does.
//  - Backward, without atomics (so the same bits every run): one kernel per
//    64 keys accumulates dK and dV over the query tiles, another per 64
//    queries accumulates dQ over the key tiles; both recompute the scores
//    and probabilities from the log-sum-exp, and D = rowsum(dout * out)
//    comes first from a small kernel.
// Q, K, V, dout and the probabilities are rounded to bf16 for the products
// (PyTorch's bf16 SDPA does the same); everything else is fp32.
#include <cuda_bf16.h>
#include <mma.h>

#include <algorithm>
#include <cmath>

#include "worker/cuda/kernels_cuda.h"
#include "worker/cuda/launch.cuh"

namespace dslaunch::worker::cuda {
namespace {

using namespace nvcuda;  // NOLINT: wmma
using bf16 = __nv_bfloat16;

constexpr int kWarps = 4;  // a block's warps, 16 rows each
constexpr int kThreads = 32 * kWarps;
constexpr int kTile = 16 * kWarps;  // rows of a block; columns of a tile
// Row strides in shared memory, padded against bank conflicts; every
// fragment's first element stays 32-byte aligned (rows in steps of 16).
template <int HS>
constexpr int kLdh = HS + 8;     // bf16 (rows, HS) tiles
constexpr int kLds = kTile + 4;  // fp32 (16, 64) scratch
constexpr int kLdp = kTile + 8;  // bf16 (16, 64) scratch
template <int HS>
constexpr int kLdo = HS + 4;  // fp32 (16, HS) rows

using FragA = wmma::fragment<wmma::matrix_a, 16, 16, 16, bf16, wmma::row_major>;
using FragAt =
    wmma::fragment<wmma::matrix_a, 16, 16, 16, bf16, wmma::col_major>;
using FragB = wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16, wmma::row_major>;
using FragBt =
    wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16, wmma::col_major>;
using FragC = wmma::fragment<wmma::accumulator, 16, 16, 16, float>;

__host__ __device__ constexpr size_t Align(size_t bytes) {
  return (bytes + 127) / 128 * 128;
}

// Shared memory carved in 128-byte aligned pieces.
struct Carver {
  unsigned char* at;
  template <typename X>
  __device__ X* Take(size_t n) {
    X* p = reinterpret_cast<X*>(at);
    at += Align(n * sizeof(X));
    return p;
  }
};

// rows x HS of head h from the (B, T, 3C) activation, part 0 (q), 1 (k) or
// 2 (v) or, with width C, from a (B, T, C) one: rows past T are zeros.
template <int HS>
__device__ void LoadTile(bf16* dst, const float* src, int width, int part,
                         int row0, int T, int h) {
  for (int i = threadIdx.x; i < kTile * HS; i += kThreads) {
    const int r = i / HS, d = i % HS, t = row0 + r;
    const float x =
        t < T ? src[static_cast<size_t>(t) * width +
                    static_cast<size_t>(part) * (width / 3) + h * HS + d]
              : 0.0f;
    dst[r * kLdh<HS> + d] = __float2bfloat16(x);
  }
}
template <int HS>
__device__ void LoadRows(bf16* dst, const float* src, int C, int row0, int T,
                         int h) {
  for (int i = threadIdx.x; i < kTile * HS; i += kThreads) {
    const int r = i / HS, d = i % HS, t = row0 + r;
    const float x = t < T ? src[static_cast<size_t>(t) * C + h * HS + d] : 0.0f;
    dst[r * kLdh<HS> + d] = __float2bfloat16(x);
  }
}

// out (16, 64) fp32 = a (16 rows at a, HS) x b (64 rows at b, HS)^T.
template <int HS>
__device__ void RowsTimesRowsT(float* out, const bf16* a, const bf16* b) {
  for (int nt = 0; nt < kTile / 16; ++nt) {
    FragC c;
    wmma::fill_fragment(c, 0.0f);
    for (int kk = 0; kk < HS / 16; ++kk) {
      FragA fa;
      FragBt fb;
      wmma::load_matrix_sync(fa, a + kk * 16, kLdh<HS>);
      wmma::load_matrix_sync(fb, b + nt * 16 * kLdh<HS> + kk * 16, kLdh<HS>);
      wmma::mma_sync(c, fa, fb, c);
    }
    wmma::store_matrix_sync(out + nt * 16, c, kLds, wmma::mem_row_major);
  }
}

// acc[dt] (16, HS in 16-wide pieces) += p (16, 64 at ld kLdp) x v (64, HS).
template <int HS>
__device__ void AccumulateTimes(FragC* acc, const bf16* p, const bf16* v) {
  for (int dt = 0; dt < HS / 16; ++dt) {
    for (int kt = 0; kt < kTile / 16; ++kt) {
      FragA fa;
      FragB fb;
      wmma::load_matrix_sync(fa, p + kt * 16, kLdp);
      wmma::load_matrix_sync(fb, v + kt * 16 * kLdh<HS> + dt * 16, kLdh<HS>);
      wmma::mma_sync(acc[dt], fa, fb, acc[dt]);
    }
  }
}

// dst (rows of `width` floats, 16 rows from row0) += acc[dt] for the rows
// below T: each 16 x 16 piece staged through this warp's scratch.
template <int HS>
__device__ void AddOut(float* dst, size_t width, int row0, int T,
                       const FragC* acc, float* scratch) {
  const int lane = threadIdx.x % 32;
  for (int dt = 0; dt < HS / 16; ++dt) {
    wmma::store_matrix_sync(scratch, acc[dt], kLds, wmma::mem_row_major);
    __syncwarp();
    for (int i = lane; i < 256; i += 32) {
      const int r = i / 16, c = i % 16;
      if (row0 + r < T)
        dst[static_cast<size_t>(row0 + r) * width + dt * 16 + c] +=
            scratch[r * kLds + c];
    }
    __syncwarp();
  }
}

template <int HS>
size_t ForwardSmem() {
  return 3 * Align(kTile * kLdh<HS> * sizeof(bf16)) +
         kWarps * (Align(16 * kLds * sizeof(float)) +
                   Align(16 * kLdp * sizeof(bf16)) +
                   Align(16 * kLdo<HS> * sizeof(float)));
}

// Grid (query tiles, B * NH). Lane l of a warp keeps row l / 2 of its 16,
// columns (l % 2) halves.
template <int HS>
__global__ void __launch_bounds__(kThreads)
    FlashForwardKernel(float* out, float* lse, const float* inp, int T, int NH,
                       float scale) {
  extern __shared__ __align__(128) unsigned char smem[];
  const int C = NH * HS, bh = blockIdx.y, b = bh / NH, h = bh % NH;
  const int q0 = blockIdx.x * kTile, warp = threadIdx.x / 32;
  const int lane = threadIdx.x % 32, r = lane / 2, half = lane % 2;
  Carver cv{smem};
  bf16* qs = cv.Take<bf16>(kTile * kLdh<HS>);
  bf16* ks = cv.Take<bf16>(kTile * kLdh<HS>);
  bf16* vs = cv.Take<bf16>(kTile * kLdh<HS>);
  float* s = nullptr;
  bf16* p = nullptr;
  float* o = nullptr;
  for (int w = 0; w < kWarps; ++w) {
    float* sw = cv.Take<float>(16 * kLds);
    bf16* pw = cv.Take<bf16>(16 * kLdp);
    float* ow = cv.Take<float>(16 * kLdo<HS>);
    if (w == warp) s = sw, p = pw, o = ow;
  }
  const float* base = inp + static_cast<size_t>(b) * T * 3 * C;
  LoadTile<HS>(qs, base, 3 * C, 0, q0, T, h);
  for (int i = lane; i < 16 * HS; i += 32) o[(i / HS) * kLdo<HS> + i % HS] = 0;
  const int query = q0 + warp * 16 + r;
  float m = -INFINITY, l = 0;
  for (int kt = 0; kt <= static_cast<int>(blockIdx.x); ++kt) {
    const int k0 = kt * kTile;
    __syncthreads();  // the last tile's readers are done
    LoadTile<HS>(ks, base, 3 * C, 1, k0, T, h);
    LoadTile<HS>(vs, base, 3 * C, 2, k0, T, h);
    __syncthreads();
    RowsTimesRowsT<HS>(s, qs + warp * 16 * kLdh<HS>, ks);
    __syncwarp();
    // The online softmax over this row's half of the tile.
    float* srow = s + r * kLds + half * 32;
    float mx = -INFINITY;
    for (int c = 0; c < 32; ++c) {
      const int key = k0 + half * 32 + c;
      const float x = key <= query ? srow[c] * scale : -INFINITY;
      srow[c] = x;
      mx = fmaxf(mx, x);
    }
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffff, mx, 1));
    const float m_new = fmaxf(m, mx);  // finite: key 0 is in tile 0
    const float alpha = expf(m - m_new);
    float sum = 0;
    bf16* prow = p + r * kLdp + half * 32;
    for (int c = 0; c < 32; ++c) {
      const float e = expf(srow[c] - m_new);
      sum += e;
      prow[c] = __float2bfloat16(e);
    }
    sum += __shfl_xor_sync(0xffffffff, sum, 1);
    l = l * alpha + sum;
    m = m_new;
    float* orow = o + r * kLdo<HS> + half * (HS / 2);
    for (int d = 0; d < HS / 2; ++d) orow[d] *= alpha;
    __syncwarp();
    FragC acc[HS / 16];
    for (int dt = 0; dt < HS / 16; ++dt)
      wmma::load_matrix_sync(acc[dt], o + dt * 16, kLdo<HS>,
                             wmma::mem_row_major);
    AccumulateTimes<HS>(acc, p, vs);
    for (int dt = 0; dt < HS / 16; ++dt)
      wmma::store_matrix_sync(o + dt * 16, acc[dt], kLdo<HS>,
                              wmma::mem_row_major);
    __syncwarp();
  }
  if (query >= T) return;
  const float inv = 1.0f / l;
  float* dst =
      out + (static_cast<size_t>(b) * T + query) * C + h * HS + half * (HS / 2);
  const float* orow = o + r * kLdo<HS> + half * (HS / 2);
  for (int d = 0; d < HS / 2; ++d) dst[d] = orow[d] * inv;
  if (half == 0) lse[static_cast<size_t>(bh) * T + query] = m + logf(l);
}

// d[bh * T + t] = sum over the head's columns of dout * out.
__global__ void RowDotKernel(float* d, const float* dout, const float* out,
                             int B, int T, int NH, int HS) {
  const size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x;
  if (i >= static_cast<size_t>(B) * NH * T) return;
  const int t = static_cast<int>(i % T);
  const size_t bh = i / T;
  const int b = static_cast<int>(bh / NH), h = static_cast<int>(bh % NH);
  const size_t at = (static_cast<size_t>(b) * T + t) * NH * HS + h * HS;
  float sum = 0;
  for (int c = 0; c < HS; ++c) sum += dout[at + c] * out[at + c];
  d[i] = sum;
}

// Both backward kernels' shared memory: the query rows and their dout, a
// key tile, the queries' log-sum-exp and D, and each warp's scratch.
template <int HS>
struct BackwardTiles {
  bf16 *qs, *dos, *ks, *vs;
  float *lse, *d;
  float *s, *dp;  // this warp's (16, 64) products
  bf16 *p, *ds;   // this warp's probabilities and scores' gradient
  __device__ BackwardTiles(unsigned char* smem, int warp) {
    Carver cv{smem};
    qs = cv.Take<bf16>(kTile * kLdh<HS>);
    dos = cv.Take<bf16>(kTile * kLdh<HS>);
    ks = cv.Take<bf16>(kTile * kLdh<HS>);
    vs = cv.Take<bf16>(kTile * kLdh<HS>);
    lse = cv.Take<float>(kTile);
    d = cv.Take<float>(kTile);
    for (int w = 0; w < kWarps; ++w) {
      float* sw = cv.Take<float>(16 * kLds);
      float* dpw = cv.Take<float>(16 * kLds);
      bf16* pw = cv.Take<bf16>(16 * kLdp);
      bf16* dsw = cv.Take<bf16>(16 * kLdp);
      if (w == warp) s = sw, dp = dpw, p = pw, ds = dsw;
    }
  }
  static size_t Bytes() {
    return 4 * Align(kTile * kLdh<HS> * sizeof(bf16)) +
           2 * Align(kTile * sizeof(float)) +
           kWarps * (2 * Align(16 * kLds * sizeof(float)) +
                     2 * Align(16 * kLdp * sizeof(bf16)));
  }
  // The query rows q0.. of head h, their dout, log-sum-exp and D; a row
  // past T gets probability 0 from an infinite log-sum-exp.
  __device__ void LoadQueries(const float* base, const float* dbase,
                              const float* lse_g, const float* dd, int bh,
                              int q0, int T, int C, int h) {
    LoadTile<HS>(qs, base, 3 * C, 0, q0, T, h);
    LoadRows<HS>(dos, dbase, C, q0, T, h);
    for (int i = threadIdx.x; i < kTile; i += kThreads) {
      const int t = q0 + i;
      lse[i] = t < T ? lse_g[static_cast<size_t>(bh) * T + t] : INFINITY;
      d[i] = t < T ? dd[static_cast<size_t>(bh) * T + t] : 0.0f;
    }
  }
};

// The probabilities and the scores' gradient of a warp's 16 x 64 tile:
// rows `row0 + r` and columns `col0 + c` are (query, key) when by_query,
// else (key, query). s holds the raw products, dp dout . v; lse and dd are
// indexed by the query's place in its tile.
__device__ void ProbsAndGrads(bf16* p, bf16* ds, const float* s,
                              const float* dp, const float* lse,
                              const float* dd, int row0, int col0,
                              bool by_query, float scale) {
  const int lane = threadIdx.x % 32, r = lane / 2, half = lane % 2;
  for (int c = half * 32; c < half * 32 + 32; ++c) {
    const int row = row0 + r, col = col0 + c;
    const int query = by_query ? row : col, key = by_query ? col : row;
    const int qi = by_query ? r : c;  // the query's place in its tile
    const float x = s[r * kLds + c] * scale;
    const float pr = key <= query ? expf(x - lse[qi]) : 0.0f;
    if (p != nullptr) p[r * kLdp + c] = __float2bfloat16(pr);
    ds[r * kLdp + c] =
        __float2bfloat16(pr * (dp[r * kLds + c] - dd[qi]) * scale);
  }
}

// Grid (key tiles, B * NH): dK and dV of 64 keys over the query tiles from
// the diagonal on. Warp w takes keys 16w..16w+15 of the tile.
template <int HS>
__global__ void __launch_bounds__(kThreads)
    FlashBackwardKvKernel(float* dinp, const float* dout, const float* inp,
                          const float* lse, const float* dd, int T, int NH,
                          float scale) {
  extern __shared__ __align__(128) unsigned char smem[];
  const int C = NH * HS, bh = blockIdx.y, b = bh / NH, h = bh % NH;
  const int k0 = blockIdx.x * kTile, warp = threadIdx.x / 32;
  BackwardTiles<HS> t(smem, warp);
  const float* base = inp + static_cast<size_t>(b) * T * 3 * C;
  const float* dbase = dout + static_cast<size_t>(b) * T * C;
  LoadTile<HS>(t.ks, base, 3 * C, 1, k0, T, h);
  LoadTile<HS>(t.vs, base, 3 * C, 2, k0, T, h);
  FragC dk[HS / 16], dv[HS / 16];
  for (int dt = 0; dt < HS / 16; ++dt) {
    wmma::fill_fragment(dk[dt], 0.0f);
    wmma::fill_fragment(dv[dt], 0.0f);
  }
  const int tiles = (T + kTile - 1) / kTile;
  for (int qt = blockIdx.x; qt < tiles; ++qt) {
    const int q0 = qt * kTile;
    __syncthreads();
    t.LoadQueries(base, dbase, lse, dd, bh, q0, T, C, h);
    __syncthreads();
    const bf16* kw = t.ks + warp * 16 * kLdh<HS>;
    const bf16* vw = t.vs + warp * 16 * kLdh<HS>;
    RowsTimesRowsT<HS>(t.s, kw, t.qs);    // (keys, queries) scores
    RowsTimesRowsT<HS>(t.dp, vw, t.dos);  // (keys, queries) dout . v
    __syncwarp();
    ProbsAndGrads(t.p, t.ds, t.s, t.dp, t.lse, t.d, k0 + warp * 16, q0,
                  /*by_query=*/false, scale);
    __syncwarp();
    AccumulateTimes<HS>(dv, t.p, t.dos);
    AccumulateTimes<HS>(dk, t.ds, t.qs);
  }
  __syncwarp();
  float* row = dinp + static_cast<size_t>(b) * T * 3 * C + h * HS;
  AddOut<HS>(row + C, 3 * C, k0 + warp * 16, T, dk, t.s);
  AddOut<HS>(row + 2 * C, 3 * C, k0 + warp * 16, T, dv, t.s);
}

// Grid (query tiles, B * NH): dQ of 64 queries over the key tiles up to the
// diagonal. Warp w takes queries 16w..16w+15.
template <int HS>
__global__ void __launch_bounds__(kThreads)
    FlashBackwardQKernel(float* dinp, const float* dout, const float* inp,
                         const float* lse, const float* dd, int T, int NH,
                         float scale) {
  extern __shared__ __align__(128) unsigned char smem[];
  const int C = NH * HS, bh = blockIdx.y, b = bh / NH, h = bh % NH;
  const int q0 = blockIdx.x * kTile, warp = threadIdx.x / 32;
  BackwardTiles<HS> t(smem, warp);
  const float* base = inp + static_cast<size_t>(b) * T * 3 * C;
  const float* dbase = dout + static_cast<size_t>(b) * T * C;
  t.LoadQueries(base, dbase, lse, dd, bh, q0, T, C, h);
  FragC dq[HS / 16];
  for (int dt = 0; dt < HS / 16; ++dt) wmma::fill_fragment(dq[dt], 0.0f);
  for (int kt = 0; kt <= static_cast<int>(blockIdx.x); ++kt) {
    const int k0 = kt * kTile;
    __syncthreads();
    LoadTile<HS>(t.ks, base, 3 * C, 1, k0, T, h);
    LoadTile<HS>(t.vs, base, 3 * C, 2, k0, T, h);
    __syncthreads();
    RowsTimesRowsT<HS>(t.s, t.qs + warp * 16 * kLdh<HS>, t.ks);    // (q, k)
    RowsTimesRowsT<HS>(t.dp, t.dos + warp * 16 * kLdh<HS>, t.vs);  // (q, k)
    __syncwarp();
    ProbsAndGrads(nullptr, t.ds, t.s, t.dp, t.lse + warp * 16, t.d + warp * 16,
                  q0 + warp * 16, k0, /*by_query=*/true, scale);
    __syncwarp();
    AccumulateTimes<HS>(dq, t.ds, t.ks);
  }
  __syncwarp();
  float* row = dinp + static_cast<size_t>(b) * T * 3 * C + h * HS;
  AddOut<HS>(row, 3 * C, q0 + warp * 16, T, dq, t.s);
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

template <int HS>
cudaError_t Forward(const Ctx& ctx, float* out, float* lse, const float* inp,
                    int B, int T, int NH) {
  const size_t smem = ForwardSmem<HS>();
  cudaError_t e = AllowSmem<FlashForwardKernel<HS>>(smem);
  if (e != cudaSuccess) return e;
  const dim3 grid((T + kTile - 1) / kTile, B * NH);
  FlashForwardKernel<HS><<<grid, kThreads, smem, ctx.stream>>>(
      out, lse, inp, T, NH, 1.0f / sqrtf(static_cast<float>(HS)));
  return cudaGetLastError();
}

template <int HS>
cudaError_t Backward(const Ctx& ctx, float* dinp, const float* dout,
                     const float* inp, const float* out, const float* lse,
                     int B, int T, int NH, float* dd) {
  const size_t rows = static_cast<size_t>(B) * NH * T;
  if (rows == 0) return cudaSuccess;
  RowDotKernel<<<launch::Blocks(rows), launch::kThreads, 0, ctx.stream>>>(
      dd, dout, out, B, T, NH, HS);
  const size_t smem = BackwardTiles<HS>::Bytes();
  cudaError_t e = AllowSmem<FlashBackwardKvKernel<HS>>(smem);
  if (e == cudaSuccess) e = AllowSmem<FlashBackwardQKernel<HS>>(smem);
  if (e != cudaSuccess) return e;
  const dim3 grid((T + kTile - 1) / kTile, B * NH);
  const float scale = 1.0f / sqrtf(static_cast<float>(HS));
  FlashBackwardKvKernel<HS><<<grid, kThreads, smem, ctx.stream>>>(
      dinp, dout, inp, lse, dd, T, NH, scale);
  FlashBackwardQKernel<HS><<<grid, kThreads, smem, ctx.stream>>>(
      dinp, dout, inp, lse, dd, T, NH, scale);
  return cudaGetLastError();
}

}  // namespace

bool FlashAttentionShape(int B, int C, int NH) {
  if (B < 1 || NH < 1 || C % NH != 0 || B * NH > 65535) return false;
  const int hs = C / NH;
  return hs == 16 || hs == 32 || hs == 64 || hs == 128;
}

bool FlashAttentionSupported(int B, int C, int NH) {
  if (!FlashAttentionShape(B, C, NH)) return false;
  size_t smem = 0;
  switch (C / NH) {
    case 16:
      smem = std::max(ForwardSmem<16>(), BackwardTiles<16>::Bytes());
      break;
    case 32:
      smem = std::max(ForwardSmem<32>(), BackwardTiles<32>::Bytes());
      break;
    case 64:
      smem = std::max(ForwardSmem<64>(), BackwardTiles<64>::Bytes());
      break;
    case 128:
      smem = std::max(ForwardSmem<128>(), BackwardTiles<128>::Bytes());
      break;
    default:
      return false;
  }
  int device = 0, optin = 0;
  if (cudaGetDevice(&device) != cudaSuccess ||
      cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin,
                             device) != cudaSuccess) {
    cudaGetLastError();
    return false;
  }
  return smem <= static_cast<size_t>(optin);
}

size_t FlashAttentionWorkspaceFloats(int B, int T, int NH) {
  return static_cast<size_t>(B) * NH * T;
}

cudaError_t FlashAttentionForward(const Ctx& ctx, float* out, float* lse,
                                  const float* inp, int B, int T, int C,
                                  int NH) {
  switch (C / NH) {
    case 16:
      return Forward<16>(ctx, out, lse, inp, B, T, NH);
    case 32:
      return Forward<32>(ctx, out, lse, inp, B, T, NH);
    case 64:
      return Forward<64>(ctx, out, lse, inp, B, T, NH);
    case 128:
      return Forward<128>(ctx, out, lse, inp, B, T, NH);
  }
  return cudaErrorInvalidValue;
}

cudaError_t FlashAttentionBackward(const Ctx& ctx, float* dinp,
                                   const float* dout, const float* inp,
                                   const float* out, const float* lse, int B,
                                   int T, int C, int NH, float* workspace) {
  switch (C / NH) {
    case 16:
      return Backward<16>(ctx, dinp, dout, inp, out, lse, B, T, NH, workspace);
    case 32:
      return Backward<32>(ctx, dinp, dout, inp, out, lse, B, T, NH, workspace);
    case 64:
      return Backward<64>(ctx, dinp, dout, inp, out, lse, B, T, NH, workspace);
    case 128:
      return Backward<128>(ctx, dinp, dout, inp, out, lse, B, T, NH, workspace);
  }
  return cudaErrorInvalidValue;
}

}  // namespace dslaunch::worker::cuda
