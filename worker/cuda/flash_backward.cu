// The fused attention's backward pass (flash_attention.cuh has the
// design): D = rowsum(dout * out), then dK and dV a block per 64 keys and
// dQ a block per 64 queries, without atomics.
#include <cmath>

#include "worker/cuda/flash_attention.cuh"

namespace dslaunch::worker::cuda {
namespace flash {
namespace {

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
// of (half, column n, pair element e). kMasked: keys past their query get
// probability 0 (the diagonal tile's; no other tile holds any).
template <bool by_query, bool kMasked, typename Lse, typename Dd>
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
      const float p = !kMasked || key <= query
                          ? exp2f(s[n][i] * s2 - lse2(half, n, e))
                          : 0.0f;
      s[n][i] = p;
      dp[n][i] = p * (dp[n][i] - dd(half, n, e)) * scale;
    }
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
    const auto lse2_of = [&](int, int n, int e) { return lse2s[column(n, e)]; };
    const auto dd_of = [&](int, int n, int e) { return dds[column(n, e)]; };
    // Masked on every tile: a second, unmasked copy of this (as the other
    // kernels have) takes it from 166 to 176 registers at head size 64,
    // 2 blocks an SM instead of 3.
    ProbsAndGrads<false, true>(s, dp, k0 + row0, q0, s2, scale, lse2_of, dd_of,
                               l);
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
    const auto lse2_of = [&](int half, int, int) { return lse2[half]; };
    const auto dd_of = [&](int half, int, int) { return dd2[half]; };
    if (ktile == qtile) {  // the diagonal
      ProbsAndGrads<true, true>(s, dp, q0 + row0, k0, s2, scale, lse2_of, dd_of,
                                l);
    } else {
      ProbsAndGrads<true, false>(s, dp, q0 + row0, k0, s2, scale, lse2_of,
                                 dd_of, l);
    }
    AccumulateTimes<HS>(dq, dp, ks);  // dQ += dS K
    __syncthreads();                  // buffer ktile % 2 is free for ktile + 2
  }
  AddRows<HS>(dinp + static_cast<size_t>(b) * T * 3 * C + h * HS, 3 * C,
              q0 + row0, T, dq, add, l);
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
  // Every refusal before anything is launched.
  constexpr size_t kv_smem = BackwardKvSmem<HS>(), q_smem = BackwardQSmem<HS>();
  cudaError_t e = AllowSmem<FlashBackwardKvKernel<HS>>(kv_smem);
  if (e == cudaSuccess) e = AllowSmem<FlashBackwardQKernel<HS>>(q_smem);
  if (e != cudaSuccess) return e;
  const bf16* qkv = Stage(ctx, workspace, inp, qkv16, B, T, C, NH);
  if (qkv == nullptr) return cudaErrorInvalidValue;
  float* dd = workspace;
  RowDotKernel<<<launch::Blocks(rows * launch::kWarp), launch::kThreads, 0,
                 ctx.stream>>>(dd, dout, out, B, T, NH, HS);
  bf16* dout16 = StagedDout(workspace, B, T, NH);
  To16Bit(ctx, CUDA_R_16BF, dout16, dout, static_cast<size_t>(B) * T * C);
  const dim3 grid((T + kTile - 1) / kTile, B * NH);
  const float scale = 1.0f / sqrtf(static_cast<float>(HS));
  FlashBackwardKvKernel<HS><<<grid, kThreads, kv_smem, ctx.stream>>>(
      dinp, dout16, qkv, lse, dd, T, NH, scale, add);
  FlashBackwardQKernel<HS><<<grid, kThreads, q_smem, ctx.stream>>>(
      dinp, dout16, qkv, lse, dd, T, NH, scale, add);
  return cudaGetLastError();
}

}  // namespace
}  // namespace flash

cudaError_t FlashAttentionBackward(const Ctx& ctx, float* dinp,
                                   const float* dout, const float* inp,
                                   const float* out, const float* lse, int B,
                                   int T, int C, int NH, float* workspace,
                                   bool add, const void* qkv16) {
  return flash::ByHeadSize(C / NH, cudaErrorInvalidValue, [&](auto hs) {
    return flash::Backward<decltype(hs)::value>(
        ctx, dinp, dout, inp, out, lse, B, T, NH, workspace, add, qkv16);
  });
}

}  // namespace dslaunch::worker::cuda
