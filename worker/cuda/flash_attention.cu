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
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "worker/cuda/kernels_cuda.h"
#include "worker/cuda/launch.cuh"
#include "worker/cuda/mma.cuh"

namespace dslaunch::worker::cuda {
namespace {

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
// The online softmax: rows g (i 0, 1) and g + 8 (i 2, 3), each spread
// over the 4 lanes of a group.
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      float mx = -INFINITY;
#pragma unroll
      for (int n = 0; n < kCols; ++n)
#pragma unroll
        for (int i = 2 * half; i < 2 * half + 2; ++i) {
          const int key = k0 + n * 8 + 2 * l.t + (i & 1);
          const float x = key <= query[half] ? s[n][i] * s2 : -INFINITY;
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

// d[bh * T + t] = the dot product of dout and out over head h's columns of
// token t: a warp per row.
__global__ void RowDotKernel(float* d, const float* dout, const float* out,
                             int B, int T, int NH, int HS) {
  const size_t i =
      (blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x) /
      launch::kWarp;
  const int lane = threadIdx.x % launch::kWarp;
  if (i >= static_cast<size_t>(B) * NH * T) return;
  const int t = static_cast<int>(i % T);
  const size_t bh = i / T;
  const size_t b = bh / NH, h = bh % NH;
  const size_t at = (b * T + t) * NH * HS + h * HS;
  float sum = 0;
  for (int c = lane; c < HS; c += launch::kWarp)
    sum += dout[at + c] * out[at + c];
  sum = launch::WarpSum(sum);
  if (lane == 0) d[i] = sum;
}

// The probabilities and the scores' gradient of a warp's 16 x kTile piece,
// in place of the products s (q . k) and dp (dout . v): rows row0 + g (+ 8)
// and columns col0 + the lane's, which are (query, key) when by_query, else
// (key, query). lse2 and dd: the log-sum-exp in base 2 and D of the query
// of (half, column n, pair element e).
template <bool by_query, typename Lse, typename Dd>
__device__ inline void ProbsAndGrads(float (*s)[4], float (*dp)[4], int row0,
                                     int col0, float s2, float scale, Lse lse2,
                                     Dd dd, Lane l) {
#pragma unroll
  for (int n = 0; n < kCols; ++n)
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int half = i / 2, e = i & 1;
      const int row = row0 + l.g + 8 * half, col = col0 + n * 8 + 2 * l.t + e;
      const int query = by_query ? row : col, key = by_query ? col : row;
      const float p =
          key <= query ? exp2f(s[n][i] * s2 - lse2(half, n, e)) : 0.0f;
      s[n][i] = p;
      dp[n][i] = p * (dp[n][i] - dd(half, n, e)) * scale;
    }
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

// Grid (key tiles, B * NH), the most query tiles first: dK and dV of 64
// keys over the query tiles from the diagonal on. Warp w takes keys
// 16w..16w+15 of the tile.
template <int HS>
__global__ void __launch_bounds__(kThreads)
    FlashBackwardKvKernel(float* dinp, const bf16* dout, const bf16* inp,
                          const float* lse, const float* dd, int T, int NH,
                          float scale, bool add) {
  extern __shared__ __align__(128) unsigned char smem[];
  const int C = NH * HS, bh = blockIdx.y, b = bh / NH, h = bh % NH;
  const int k0 = blockIdx.x * kTile, row0 = (threadIdx.x / 32) * 16;
  const Lane l;
  Carver cv{smem};
  bf16* ks = cv.Take<bf16>(kTileElems<HS>);
  bf16* vs = cv.Take<bf16>(kTileElems<HS>);
  bf16* qbuf = cv.Take<bf16>(2 * kTileElems<HS>);
  bf16* dbuf = cv.Take<bf16>(2 * kTileElems<HS>);
  float* lse2buf = cv.Take<float>(2 * kTile);
  float* ddbuf = cv.Take<float>(2 * kTile);
  const bf16* base = inp + static_cast<size_t>(b) * T * 3 * C + h * HS;
  const bf16* dbase = dout + static_cast<size_t>(b) * T * C + h * HS;
  // Query tile qt's Q and dout into buffer (its index in the walk) % 2.
  const auto start = [=](int qt) {
    const int i = (qt - static_cast<int>(blockIdx.x)) & 1, q0 = qt * kTile;
    LoadTile<HS>(qbuf + i * kTileElems<HS>, base, 3 * C, q0, T);
    LoadTile<HS>(dbuf + i * kTileElems<HS>, dbase, C, q0, T);
  };
  // Its log-sum-exp (base 2) and D for thread j < kTile's query (past T:
  // probability 0), read from global memory into registers.
  const auto scalars = [=](int qt, float* l2, float* d) {
    const int t = qt * kTile + static_cast<int>(threadIdx.x);
    const bool in = threadIdx.x < kTile && t < T;
    *l2 = in ? lse[static_cast<size_t>(bh) * T + t] * kLog2e : INFINITY;
    *d = in ? dd[static_cast<size_t>(bh) * T + t] : 0.0f;
  };
  LoadTile<HS>(ks, base + C, 3 * C, k0, T);
  LoadTile<HS>(vs, base + 2 * C, 3 * C, k0, T);
  start(blockIdx.x);
  CopyCommit();
  float next_l2 = 0, next_d = 0;
  scalars(blockIdx.x, &next_l2, &next_d);
  if (threadIdx.x < kTile) {
    lse2buf[threadIdx.x] = next_l2;
    ddbuf[threadIdx.x] = next_d;
  }
  const float s2 = scale * kLog2e;
  float dk[HS / 8][4] = {}, dv[HS / 8][4] = {};
  const int tiles = (T + kTile - 1) / kTile;
  for (int qtile = blockIdx.x; qtile < tiles; ++qtile) {
    const int q0 = qtile * kTile;
    const int i = (qtile - static_cast<int>(blockIdx.x)) & 1;
    const bool more = qtile + 1 < tiles;
    if (more) {
      start(qtile + 1);
      // Read now, stored after this tile's products: their latency hidden.
      scalars(qtile + 1, &next_l2, &next_d);
    }
    AwaitTile(more);
    const bf16* qs = qbuf + i * kTileElems<HS>;
    const bf16* dos = dbuf + i * kTileElems<HS>;
    const float* lse2s = lse2buf + i * kTile;
    const float* dds = ddbuf + i * kTile;
    float s[kCols][4], dp[kCols][4];
    RowsTimesRowsT<HS>(s, ks, row0, qs, l);    // (keys, queries) q . k
    RowsTimesRowsT<HS>(dp, vs, row0, dos, l);  // (keys, queries) dout . v
    const auto column = [&](int n, int e) { return n * 8 + 2 * l.t + e; };
    ProbsAndGrads<false>(
        s, dp, k0 + row0, q0, s2, scale,
        [&](int, int n, int e) { return lse2s[column(n, e)]; },
        [&](int, int n, int e) { return dds[column(n, e)]; }, l);
    AccumulateTimes<HS>(dv, s, dos);    // dV += P^T dout
    AccumulateTimes<HS>(dk, dp, qs);    // dK += dS^T Q
    if (more && threadIdx.x < kTile) {  // into the other buffer, unread now
      lse2buf[(i ^ 1) * kTile + threadIdx.x] = next_l2;
      ddbuf[(i ^ 1) * kTile + threadIdx.x] = next_d;
    }
    __syncthreads();  // buffer i is free for the tile after next
  }
  float* row = dinp + static_cast<size_t>(b) * T * 3 * C + h * HS;
  AddRows<HS>(row + C, 3 * C, k0 + row0, T, dk, add, l);
  AddRows<HS>(row + 2 * C, 3 * C, k0 + row0, T, dv, add, l);
}

// Grid (query tiles, B * NH), the longest rows first: dQ of 64 queries over
// the key tiles up to the diagonal. Warp w takes queries 16w..16w+15.
template <int HS>
__global__ void __launch_bounds__(kThreads)
    FlashBackwardQKernel(float* dinp, const bf16* dout, const bf16* inp,
                         const float* lse, const float* dd, int T, int NH,
                         float scale, bool add) {
  extern __shared__ __align__(128) unsigned char smem[];
  const int C = NH * HS, bh = blockIdx.y, b = bh / NH, h = bh % NH;
  const int qtile = gridDim.x - 1 - blockIdx.x, q0 = qtile * kTile;
  const int row0 = (threadIdx.x / 32) * 16;
  const Lane l;
  Carver cv{smem};
  bf16* qs = cv.Take<bf16>(kTileElems<HS>);
  bf16* dos = cv.Take<bf16>(kTileElems<HS>);
  bf16* kbuf = cv.Take<bf16>(2 * kTileElems<HS>);
  bf16* vbuf = cv.Take<bf16>(2 * kTileElems<HS>);
  const bf16* base = inp + static_cast<size_t>(b) * T * 3 * C + h * HS;
  const bf16* dbase = dout + static_cast<size_t>(b) * T * C + h * HS;
  LoadTile<HS>(qs, base, 3 * C, q0, T);
  LoadTile<HS>(dos, dbase, C, q0, T);
  LoadKeysValues<HS>(kbuf, vbuf, base, C, 0, T);
  CopyCommit();
  const float s2 = scale * kLog2e;
  float lse2[2], dd2[2];
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int t = q0 + row0 + l.g + 8 * half;
    lse2[half] =
        t < T ? lse[static_cast<size_t>(bh) * T + t] * kLog2e : INFINITY;
    dd2[half] = t < T ? dd[static_cast<size_t>(bh) * T + t] : 0.0f;
  }
  float dq[HS / 8][4] = {};
  for (int ktile = 0; ktile <= qtile; ++ktile) {
    const int k0 = ktile * kTile;
    if (ktile < qtile) LoadKeysValues<HS>(kbuf, vbuf, base, C, ktile + 1, T);
    AwaitTile(ktile < qtile);
    const bf16* ks = kbuf + (ktile & 1) * kTileElems<HS>;
    const bf16* vs = vbuf + (ktile & 1) * kTileElems<HS>;
    float s[kCols][4], dp[kCols][4];
    RowsTimesRowsT<HS>(s, qs, row0, ks, l);    // (queries, keys)
    RowsTimesRowsT<HS>(dp, dos, row0, vs, l);  // (queries, keys)
    ProbsAndGrads<true>(
        s, dp, q0 + row0, k0, s2, scale,
        [&](int half, int, int) { return lse2[half]; },
        [&](int half, int, int) { return dd2[half]; }, l);
    AccumulateTimes<HS>(dq, dp, ks);  // dQ += dS K
    __syncthreads();                  // buffer ktile % 2 is free for ktile + 2
  }
  AddRows<HS>(dinp + static_cast<size_t>(b) * T * 3 * C + h * HS, 3 * C,
              q0 + row0, T, dq, add, l);
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
bool Aligned(const float* workspace) {
  return workspace != nullptr &&
         reinterpret_cast<uintptr_t>(workspace) % 16 == 0;
}

// The workspace: D (B * NH * T floats, padded to 16 bytes), then the
// staged bf16 inputs, dout (B, T, C) and, unless they come rounded, qkv
// (B, T, 3C) (C is a multiple of 16: each starts 16-byte aligned).
size_t DdFloats(int B, int T, int NH) {
  return (static_cast<size_t>(B) * NH * T + 3) / 4 * 4;
}
bf16* StagedDout(float* workspace, int B, int T, int NH) {
  return reinterpret_cast<bf16*>(workspace + DdFloats(B, T, NH));
}
bf16* StagedQkv(float* workspace, int B, int T, int C, int NH) {
  return StagedDout(workspace, B, T, NH) + static_cast<size_t>(B) * T * C;
}
// Q, K and V rounded to bf16 (what the kernels would round them to on every
// load, once: the same bits) at the staging place, or as they come rounded
// (qkv16); null where qkv16 is not 16-byte aligned or there is neither.
const bf16* Stage(const Ctx& ctx, float* workspace, const float* inp,
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

template <int HS>
cudaError_t Backward(const Ctx& ctx, float* dinp, const float* dout,
                     const float* inp, const float* out, const float* lse,
                     int B, int T, int NH, float* workspace, bool add,
                     const void* qkv16) {
  const size_t rows = static_cast<size_t>(B) * NH * T;
  if (rows == 0) return cudaSuccess;
  if (!Aligned(workspace)) return cudaErrorInvalidValue;
  const int C = NH * HS;
  const bf16* qkv = Stage(ctx, workspace, inp, qkv16, B, T, C, NH);
  if (qkv == nullptr) return cudaErrorInvalidValue;  // nothing launched
  float* dd = workspace;
  RowDotKernel<<<launch::Blocks(rows * launch::kWarp), launch::kThreads, 0,
                 ctx.stream>>>(dd, dout, out, B, T, NH, HS);
  bf16* dout16 = StagedDout(workspace, B, T, NH);
  To16Bit(ctx, CUDA_R_16BF, dout16, dout, static_cast<size_t>(B) * T * C);
  constexpr size_t kv_smem = BackwardKvSmem<HS>(), q_smem = BackwardQSmem<HS>();
  cudaError_t e = AllowSmem<FlashBackwardKvKernel<HS>>(kv_smem);
  if (e == cudaSuccess) e = AllowSmem<FlashBackwardQKernel<HS>>(q_smem);
  if (e != cudaSuccess) return e;
  const dim3 grid((T + kTile - 1) / kTile, B * NH);
  const float scale = 1.0f / sqrtf(static_cast<float>(HS));
  FlashBackwardKvKernel<HS><<<grid, kThreads, kv_smem, ctx.stream>>>(
      dinp, dout16, qkv, lse, dd, T, NH, scale, add);
  FlashBackwardQKernel<HS><<<grid, kThreads, q_smem, ctx.stream>>>(
      dinp, dout16, qkv, lse, dd, T, NH, scale, add);
  return cudaGetLastError();
}

template <int HS>
constexpr size_t MostSmem() {
  return std::max(
      {ForwardSmem<HS>(), BackwardKvSmem<HS>(), BackwardQSmem<HS>()});
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
      smem = MostSmem<16>();
      break;
    case 32:
      smem = MostSmem<32>();
      break;
    case 64:
      smem = MostSmem<64>();
      break;
    case 128:
      smem = MostSmem<128>();
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

size_t FlashAttentionWorkspaceFloats(int B, int T, int C, int NH, bool qkv16) {
  // D, then dout and qkv (unless it comes rounded) at 2 bytes an element.
  const size_t btc = static_cast<size_t>(B) * T * C;
  return DdFloats(B, T, NH) + (qkv16 ? btc / 2 : 2 * btc);
}

cudaError_t FlashAttentionForward(const Ctx& ctx, float* out, float* lse,
                                  const float* inp, int B, int T, int C, int NH,
                                  float* workspace, void* out16,
                                  const void* qkv16) {
  switch (C / NH) {
    case 16:
      return Forward<16>(ctx, out, lse, inp, B, T, NH, out16, workspace, qkv16);
    case 32:
      return Forward<32>(ctx, out, lse, inp, B, T, NH, out16, workspace, qkv16);
    case 64:
      return Forward<64>(ctx, out, lse, inp, B, T, NH, out16, workspace, qkv16);
    case 128:
      return Forward<128>(ctx, out, lse, inp, B, T, NH, out16, workspace,
                          qkv16);
  }
  return cudaErrorInvalidValue;
}

cudaError_t FlashAttentionBackward(const Ctx& ctx, float* dinp,
                                   const float* dout, const float* inp,
                                   const float* out, const float* lse, int B,
                                   int T, int C, int NH, float* workspace,
                                   bool add, const void* qkv16) {
  switch (C / NH) {
    case 16:
      return Backward<16>(ctx, dinp, dout, inp, out, lse, B, T, NH, workspace,
                          add, qkv16);
    case 32:
      return Backward<32>(ctx, dinp, dout, inp, out, lse, B, T, NH, workspace,
                          add, qkv16);
    case 64:
      return Backward<64>(ctx, dinp, dout, inp, out, lse, B, T, NH, workspace,
                          add, qkv16);
    case 128:
      return Backward<128>(ctx, dinp, dout, inp, out, lse, B, T, NH, workspace,
                           add, qkv16);
  }
  return cudaErrorInvalidValue;
}

}  // namespace dslaunch::worker::cuda
