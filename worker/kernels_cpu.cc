#include "worker/kernels_cpu.h"

#include <cblas.h>  // cblas_sgemm, openblas_set_num_threads (OpenBLAS)

#include <algorithm>         // std::min, std::max
#include <bit>               // std::bit_cast
#include <cmath>             // std::log, sqrtf
#include <cstdint>           // int32_t, uint32_t
#include <cstdlib>           // std::getenv
#include <cstring>           // memcpy, strcmp
#include <initializer_list>  // RunGemms
#include <mutex>             // std::call_once
#include <vector>            // per-thread attention scratch

#include "proto/status.h"  // DSL_CHECK

namespace dslaunch::worker {
namespace {

// Reductions over rows (dweight, dbias, dwte) are split into blocks of
// columns, one block per OpenMP iteration: race-free and independent of the
// thread count.
constexpr int kColBlock = 64;

constexpr float kLayerNormEps = 1e-5f;

inline size_t Idx(size_t row, size_t width) { return row * width; }

void EnsureBlasSingleThreaded() {
  static std::once_flag once;
  std::call_once(once, [] { openblas_set_num_threads(1); });
}

// ------------------------------------------------------------ vector math
//
// Row and range loops below are written so that GCC vectorises them without
// -ffast-math: sums are `omp simd` reductions (vector partial sums combined
// in an order fixed by the compiled code, the same on every call), maxima
// run in explicit partial lanes, and exp has no branches. Each is compiled
// twice, for AVX2+FMA and for the build's baseline, and picked at load time
// (ifunc), so the last bits depend on the CPU, never on the thread count.
#define DSL_SIMD_CLONES \
  __attribute__((target_clones("arch=x86-64-v3", "default")))

// exp(x) within 2 ulp for x in [-87, 88]; x is clamped to that range first
// (exp(-87) = 1.6e-38 stands in for 0, exp(88) = 1.65e38 for overflow). The
// clamp works on the bit pattern with integer compares: a float compare
// would let GCC split the loop into paths and give up vectorising.
// Cephes' expf: exp(x) = 2^n exp(r), |r| <= ln2/2, degree-6 polynomial.
inline float Exp(float x) {
  uint32_t bits = std::bit_cast<uint32_t>(x);
  bits = bits > 0xC2AE0000u ? 0xC2AE0000u : bits;  // below -87.0f
  int32_t sbits = static_cast<int32_t>(bits);
  sbits = sbits > 0x42B00000 ? 0x42B00000 : sbits;  // above 88.0f
  x = std::bit_cast<float>(sbits);
  constexpr float kRound = 12582912.0f;  // 1.5 * 2^23: t's low bits hold n
  const float t = x * 1.44269504088896341f + kRound;
  const float n = t - kRound;
  float r = x - n * 0.693359375f;
  r = r - n * -2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * (r * r) + r + 1.0f;
  const uint32_t e = std::bit_cast<uint32_t>(t) - 0x4B400000u + 127u;
  return p * std::bit_cast<float>(e << 23);
}

// Maximum of x[0..n), n >= 1, in 16 partial maxima: GCC 12 compiles an
// `omp simd` max reduction into code 2-3x slower than this.
DSL_SIMD_CLONES float RowMax(const float* x, int n) {
  constexpr int kLanes = 16;
  float acc[kLanes];
  for (int j = 0; j < kLanes; j++) acc[j] = x[0];
  int i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    for (int j = 0; j < kLanes; j++) acc[j] = std::max(acc[j], x[i + j]);
  }
  for (; i < n; i++) acc[0] = std::max(acc[0], x[i]);
  for (int j = 1; j < kLanes; j++) acc[0] = std::max(acc[0], acc[j]);
  return acc[0];
}

// y[i] = exp(x[i] - shift) for i < n (y may be x); returns the sum, kept in
// float for 1024 elements at a time and in a double across those.
DSL_SIMD_CLONES double ExpShiftSum(float* y, const float* x, int n,
                                   float shift) {
  double total = 0.0;
  for (int i0 = 0; i0 < n; i0 += 1024) {
    const int i1 = std::min(n, i0 + 1024);
    float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
    for (int i = i0; i < i1; i++) {
      y[i] = Exp(x[i] - shift);
      sum += y[i];
    }
    total += sum;
  }
  return total;
}

DSL_SIMD_CLONES void ScaleRow(float* x, int n, float s) {
  for (int i = 0; i < n; i++) x[i] *= s;
}

}  // namespace

// ------------------------------------------------------------------- GEMM

namespace {

// A GEMM's C (M x N, inner dimension K) is cut into r x c tiles, r and c
// powers of two: r * c = the largest power of two not above M*N*K /
// kTileWork, at most kMaxTiles, and of those splits the one that packs the
// least (every tile packs its rows of A and its columns of B: c * M + r * N
// rows of K floats in all). Only the shape decides, never the thread count.
// Each tile repacks its operands, so more tiles cost: with 2 threads on the
// GPT-2 shapes, 8 tiles per GEMM ran 5-10% slower than 2 and 4 tiles about
// 3% slower; 4 keeps up to 4 threads busy (MatmulBackward runs its two GEMMs'
// tiles together: up to 8).
constexpr double kTileWork = 1 << 25;  // multiply-adds, ~0.4 ms on one core
constexpr int kMaxTiles = 4, kMinTileSide = 16;

struct TileGrid {
  int rows, cols;  // tile size (edge tiles are smaller)
  int row_tiles, col_tiles;
  int count() const { return row_tiles * col_tiles; }
};

int CeilDiv(int a, int b) { return (a + b - 1) / b; }

TileGrid MakeTileGrid(int M, int N, int K) {
  const double work = static_cast<double>(M) * N * std::max(K, 1);
  int tiles = 1;
  while (tiles < kMaxTiles && work >= 2 * tiles * kTileWork) tiles *= 2;
  int best_r = 1, best_c = 1;
  double best_cost = -1;
  for (int r = 1; r <= tiles; r *= 2) {
    const int c = tiles / r;
    if ((r > 1 && M < r * kMinTileSide) || (c > 1 && N < c * kMinTileSide)) {
      continue;
    }
    const double cost = static_cast<double>(c) * M + static_cast<double>(r) * N;
    if (best_cost < 0 || cost < best_cost) {
      best_r = r;
      best_c = c;
      best_cost = cost;
    }
  }
  const int tm = CeilDiv(M, best_r), tn = CeilDiv(N, best_c);
  return TileGrid{tm, tn, CeilDiv(M, tm), CeilDiv(N, tn)};
}

CBLAS_TRANSPOSE Cblas(Transpose t) {
  return t == Transpose::kYes ? CblasTrans : CblasNoTrans;
}

// One GEMM for RunGemms: cblas_sgemm's arguments (row-major). When row_init
// is set, every row of C is first overwritten with it (a bias) and beta is
// taken as 1.
struct GemmJob {
  Transpose ta, tb;
  int M, N, K;
  float alpha;
  const float* A;
  int lda;
  const float* B;
  int ldb;
  float beta;
  float* C;
  int ldc;
  const float* row_init = nullptr;
};

// C[i0:i0+m, j0:j0+n] of `g`, as one cblas_sgemm call over the full K.
void RunTile(const GemmJob& g, int i0, int m, int j0, int n) {
  float* c = g.C + Idx(i0, g.ldc) + j0;
  float beta = g.beta;
  if (g.row_init != nullptr) {
    for (int i = 0; i < m; i++) {
      std::memcpy(c + Idx(i, g.ldc), g.row_init + j0, sizeof(float) * n);
    }
    beta = 1.0f;
  }
  const float* a = g.ta == Transpose::kYes ? g.A + i0 : g.A + Idx(i0, g.lda);
  const float* b = g.tb == Transpose::kYes ? g.B + Idx(j0, g.ldb) : g.B + j0;
  cblas_sgemm(CblasRowMajor, Cblas(g.ta), Cblas(g.tb), m, n, g.K, g.alpha, a,
              g.lda, b, g.ldb, beta, c, g.ldc);
}

// Runs GEMMs with independent outputs: the tiles of all of them in one
// OpenMP loop, spread dynamically (which thread runs a tile does not change
// its result).
void RunGemms(std::initializer_list<GemmJob> jobs) {
  EnsureBlasSingleThreaded();
  constexpr int kMaxJobs = 2;
  DSL_CHECK(jobs.size() <= kMaxJobs);
  const GemmJob* job[kMaxJobs];
  TileGrid grid[kMaxJobs];
  int first[kMaxJobs + 1] = {0};
  int n = 0;
  for (const GemmJob& g : jobs) {
    if (g.M <= 0 || g.N <= 0) continue;
    job[n] = &g;
    grid[n] = MakeTileGrid(g.M, g.N, g.K);
    first[n + 1] = first[n] + grid[n].count();
    n++;
  }
#pragma omp parallel for schedule(dynamic, 1) if (first[n] > 1)
  for (int t = 0; t < first[n]; t++) {
    const int j = t < first[1] ? 0 : 1;
    const TileGrid& tg = grid[j];
    const int k = t - first[j];
    const int i0 = (k / tg.col_tiles) * tg.rows,
              j0 = (k % tg.col_tiles) * tg.cols;
    RunTile(*job[j], i0, std::min(tg.rows, job[j]->M - i0), j0,
            std::min(tg.cols, job[j]->N - j0));
  }
}

}  // namespace

void Gemm(Transpose trans_a, Transpose trans_b, int M, int N, int K,
          float alpha, const float* A, int lda, const float* B, int ldb,
          float beta, float* C, int ldc) {
  RunGemms({GemmJob{trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C,
                    ldc}});
}

const char* OpenBlasCoretypeOverride() {
  if (std::getenv("OPENBLAS_CORETYPE") != nullptr) return nullptr;
  if (std::strcmp(openblas_get_corename(), "Prescott") != 0) return nullptr;
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f")) return "SkylakeX";
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) {
    return "Haswell";
  }
  return nullptr;
}

void MatmulForward(float* out, const float* inp, const float* weight,
                   const float* bias, int N, int C, int OC) {
  using T = Transpose;
  RunGemms({GemmJob{T::kNo, T::kYes, N, OC, C, 1.0f, inp, C, weight, C, 0.0f,
                    out, OC, bias}});
}

void MatmulBackward(float* dinp, float* dweight, float* dbias,
                    const float* dout, const float* inp, const float* weight,
                    int N, int C, int OC) {
  using T = Transpose;
  // dweight += dout^T inp; dinp += dout weight.
  const GemmJob dw = {T::kYes, T::kNo, OC, C,    N,       1.0f, dout,
                      OC,      inp,    C,  1.0f, dweight, C};
  const GemmJob dx = {T::kNo, T::kNo, N, C,    OC,   1.0f, dout,
                      OC,     weight, C, 1.0f, dinp, C};
  if (dinp != nullptr) {
    RunGemms({dw, dx});
  } else {
    RunGemms({dw});
  }
  if (dbias == nullptr) return;
#pragma omp parallel for schedule(static)
  for (int o0 = 0; o0 < OC; o0 += kColBlock) {
    const int o1 = std::min(OC, o0 + kColBlock);
    double acc[kColBlock] = {};
    for (int i = 0; i < N; i++) {
      const float* g = dout + Idx(i, OC);
      for (int o = o0; o < o1; o++) acc[o - o0] += g[o];
    }
    for (int o = o0; o < o1; o++) dbias[o] += static_cast<float>(acc[o - o0]);
  }
}

void MatmulForwardReference(float* out, const float* inp, const float* weight,
                            const float* bias, int N, int C, int OC) {
  for (int i = 0; i < N; i++) {
    for (int o = 0; o < OC; o++) {
      double acc = bias != nullptr ? bias[o] : 0.0;
      for (int c = 0; c < C; c++) {
        acc += static_cast<double>(inp[Idx(i, C) + c]) * weight[Idx(o, C) + c];
      }
      out[Idx(i, OC) + o] = static_cast<float>(acc);
    }
  }
}

void MatmulBackwardReference(float* dinp, float* dweight, float* dbias,
                             const float* dout, const float* inp,
                             const float* weight, int N, int C, int OC) {
  for (int i = 0; i < N && dinp != nullptr; i++) {
    for (int c = 0; c < C; c++) {
      double acc = 0.0;
      for (int o = 0; o < OC; o++) {
        acc +=
            static_cast<double>(dout[Idx(i, OC) + o]) * weight[Idx(o, C) + c];
      }
      dinp[Idx(i, C) + c] += static_cast<float>(acc);
    }
  }
  for (int o = 0; o < OC; o++) {
    for (int c = 0; c < C; c++) {
      double acc = 0.0;
      for (int i = 0; i < N; i++) {
        acc += static_cast<double>(dout[Idx(i, OC) + o]) * inp[Idx(i, C) + c];
      }
      dweight[Idx(o, C) + c] += static_cast<float>(acc);
    }
    if (dbias == nullptr) continue;
    double acc = 0.0;
    for (int i = 0; i < N; i++) acc += dout[Idx(i, OC) + o];
    dbias[o] += static_cast<float>(acc);
  }
}

// ------------------------------------------------ embedding, LayerNorm

void EncoderForward(float* out, const int* inp, const float* wte,
                    const float* wpe, int B, int T, int C) {
#pragma omp parallel for collapse(2) schedule(static)
  for (int b = 0; b < B; b++) {
    for (int t = 0; t < T; t++) {
      const size_t bt = static_cast<size_t>(b) * T + t;
      float* o = out + Idx(bt, C);
      const float* e = wte + Idx(inp[bt], C);
      const float* p = wpe + Idx(t, C);
      for (int c = 0; c < C; c++) o[c] = e[c] + p[c];
    }
  }
}

void EncoderBackward(float* dwte, float* dwpe, const float* dout,
                     const int* inp, int B, int T, int C) {
  const int rows = B * T;
#pragma omp parallel for schedule(static)
  for (int c0 = 0; c0 < C; c0 += kColBlock) {
    const int c1 = std::min(C, c0 + kColBlock);
    for (int bt = 0; bt < rows; bt++) {
      float* d = dwte + Idx(inp[bt], C);
      const float* g = dout + Idx(bt, C);
      for (int c = c0; c < c1; c++) d[c] += g[c];
    }
  }
#pragma omp parallel for schedule(static)
  for (int t = 0; t < T; t++) {
    float* d = dwpe + Idx(t, C);
    for (int b = 0; b < B; b++) {
      const float* g = dout + Idx(static_cast<size_t>(b) * T + t, C);
      for (int c = 0; c < C; c++) d[c] += g[c];
    }
  }
}

namespace {

// One row of LayerNormForward.
DSL_SIMD_CLONES void LayerNormRow(float* out, float* mean, float* rstd,
                                  const float* x, const float* weight,
                                  const float* bias, int C) {
  float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
  for (int c = 0; c < C; c++) sum += x[c];
  const float m = sum / C;
  float sq = 0.0f;
#pragma omp simd reduction(+ : sq)
  for (int c = 0; c < C; c++) sq += (x[c] - m) * (x[c] - m);
  const float s = 1.0f / sqrtf(sq / C + kLayerNormEps);
  for (int c = 0; c < C; c++) out[c] = (x[c] - m) * s * weight[c] + bias[c];
  *mean = m;
  *rstd = s;
}

// dinp of one row of LayerNormBackward.
DSL_SIMD_CLONES void LayerNormRowBackward(float* dinp, const float* g,
                                          const float* x, const float* weight,
                                          float m, float s, int C) {
  float dnorm_sum = 0.0f, dnorm_norm_sum = 0.0f;
#pragma omp simd reduction(+ : dnorm_sum, dnorm_norm_sum)
  for (int c = 0; c < C; c++) {
    const float dnorm = weight[c] * g[c];
    dnorm_sum += dnorm;
    dnorm_norm_sum += dnorm * (x[c] - m) * s;
  }
  const float dnorm_mean = dnorm_sum / C, dnorm_norm_mean = dnorm_norm_sum / C;
  for (int c = 0; c < C; c++) {
    const float norm = (x[c] - m) * s;
    dinp[c] += (weight[c] * g[c] - dnorm_mean - norm * dnorm_norm_mean) * s;
  }
}

}  // namespace

void LayerNormForward(float* out, float* mean, float* rstd, const float* inp,
                      const float* weight, const float* bias, int N, int C) {
#pragma omp parallel for schedule(static)
  for (int i = 0; i < N; i++) {
    LayerNormRow(out + Idx(i, C), mean + i, rstd + i, inp + Idx(i, C), weight,
                 bias, C);
  }
}

void LayerNormBackward(float* dinp, float* dweight, float* dbias,
                       const float* dout, const float* inp, const float* weight,
                       const float* mean, const float* rstd, int N, int C) {
#pragma omp parallel for schedule(static)
  for (int i = 0; i < N; i++) {
    LayerNormRowBackward(dinp + Idx(i, C), dout + Idx(i, C), inp + Idx(i, C),
                         weight, mean[i], rstd[i], C);
  }
#pragma omp parallel for schedule(static)
  for (int c0 = 0; c0 < C; c0 += kColBlock) {
    const int c1 = std::min(C, c0 + kColBlock);
    for (int i = 0; i < N; i++) {
      const float* x = inp + Idx(i, C);
      const float* g = dout + Idx(i, C);
      for (int c = c0; c < c1; c++) {
        dweight[c] += (x[c] - mean[i]) * rstd[i] * g[c];
        dbias[c] += g[c];
      }
    }
  }
}

// --------------------------------------------------------------- attention

namespace {

// Query rows per block of the blocked attention (64 and 256 were slower on
// GPT-2's head size 64).
constexpr int kQueryBlock = 128;

// Per-thread scratch, kept between calls (OpenMP reuses its threads): slot
// 0 and 1 hold at least n floats each.
float* Scratch(int slot, size_t n) {
  thread_local std::vector<float> buffers[2];
  if (buffers[slot].size() < n) buffers[slot].resize(n);
  return buffers[slot].data();
}

// Geometry of the (B, T, 3C) qkv buffer for one (batch, head).
struct HeadView {
  const float* qkv;  // row t of this batch element starts at qkv + t * c3
  int c3;            // 3C, the leading dimension of q, k and v
  int C, hs, h;
  const float* q(int t) const { return qkv + Idx(t, c3) + h * hs; }
  const float* k(int t) const { return qkv + Idx(t, c3) + C + h * hs; }
  const float* v(int t) const { return qkv + Idx(t, c3) + 2 * C + h * hs; }
};

HeadView MakeHeadView(const float* inp, int b, int h, int T, int C, int NH) {
  const int c3 = 3 * C;
  return HeadView{inp + Idx(static_cast<size_t>(b) * T, c3), c3, C, C / NH, h};
}

// Softmax in place over row[0..n) (already scaled scores), zeroes
// row[n..width); returns the log-sum-exp.
float SoftmaxRow(float* row, int n, int width) {
  const float maxv = RowMax(row, n);
  const double sum = ExpShiftSum(row, row, n, maxv);
  ScaleRow(row, n, static_cast<float>(1.0 / sum));
  std::fill(row + n, row + width, 0.0f);
  return maxv + static_cast<float>(std::log(sum));
}

// Query rows [t0, t1) of one head: S = scale q k^T over keys [0, t1)
// (s: (t1-t0) x t1 scratch), causal softmax, out rows = S v.
void AttentionBlockForward(float* out, float* lse, const HeadView& hv, int t0,
                           int t1, float scale, float* s) {
  const int m = t1 - t0, e = t1;
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, m, e, hv.hs, scale,
              hv.q(t0), hv.c3, hv.k(0), hv.c3, 0.0f, s, e);
  for (int r = 0; r < m; r++) {
    lse[t0 + r] = SoftmaxRow(s + Idx(r, e), t0 + r + 1, e);
  }
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, m, hv.hs, e, 1.0f, s,
              e, hv.v(0), hv.c3, 0.0f, out + Idx(t0, hv.C) + hv.h * hv.hs,
              hv.C);
}

}  // namespace

void AttentionForward(float* out, float* lse, const float* inp, int B, int T,
                      int C, int NH) {
  EnsureBlasSingleThreaded();
  const int hs = C / NH;
  const float scale = 1.0f / sqrtf(static_cast<float>(hs));
  const int blocks = CeilDiv(T, kQueryBlock);
#pragma omp parallel
  {
    float* s = Scratch(0, Idx(std::min(T, kQueryBlock), T));
    // Longest blocks (the last query rows) first, for the dynamic schedule.
#pragma omp for collapse(3) schedule(dynamic, 1)
    for (int qb = blocks - 1; qb >= 0; qb--) {
      for (int b = 0; b < B; b++) {
        for (int h = 0; h < NH; h++) {
          const HeadView hv = MakeHeadView(inp, b, h, T, C, NH);
          const int t0 = qb * kQueryBlock, t1 = std::min(T, t0 + kQueryBlock);
          AttentionBlockForward(out + Idx(static_cast<size_t>(b) * T, C),
                                lse + Idx(static_cast<size_t>(b) * NH + h, T),
                                hv, t0, t1, scale, s);
        }
      }
    }
  }
}

namespace {

// For query row t of the backward pass: p = exp(s - lse) over the row's
// n = t + 1 keys (s holds scaled scores), then, with dp = dout . v on input,
// dp becomes the score gradient p (dp - sum(p dp)) * scale. Both rows are
// zeroed from n to width.
DSL_SIMD_CLONES void ScoreGradRow(float* p, float* dp, int n, int width,
                                  float lse, float scale) {
  ExpShiftSum(p, p, n, lse);
  float dsum = 0.0f;
#pragma omp simd reduction(+ : dsum)
  for (int j = 0; j < n; j++) dsum += p[j] * dp[j];
  for (int j = 0; j < n; j++) dp[j] = p[j] * (dp[j] - dsum) * scale;
  std::fill(p + n, p + width, 0.0f);
  std::fill(dp + n, dp + width, 0.0f);
}

// Backward of query rows [t0, t1) of one head into dqkv (same geometry as
// hv); p and dp are (t1-t0) x t1 scratch. dout points at row t0's head slice.
void AttentionBlockBackward(float* dqkv, const HeadView& hv, const float* dout,
                            const float* lse, int t0, int t1, float scale,
                            float* p, float* dp) {
  const int m = t1 - t0, e = t1, hs = hv.hs, c3 = hv.c3;
  float* dq = dqkv + Idx(t0, c3) + hv.h * hs;
  float* dk = dqkv + hv.C + hv.h * hs;
  float* dv = dk + hv.C;
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, m, e, hs, scale,
              hv.q(t0), c3, hv.k(0), c3, 0.0f, p, e);
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, m, e, hs, 1.0f, dout,
              hv.C, hv.v(0), c3, 0.0f, dp, e);
  for (int r = 0; r < m; r++) {
    ScoreGradRow(p + Idx(r, e), dp + Idx(r, e), t0 + r + 1, e, lse[t0 + r],
                 scale);
  }
  // dv += p^T dout; dq += ds k; dk += ds^T q (ds is in dp).
  cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, e, hs, m, 1.0f, p, e,
              dout, hv.C, 1.0f, dv, c3);
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, m, hs, e, 1.0f, dp, e,
              hv.k(0), c3, 1.0f, dq, c3);
  cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, e, hs, m, 1.0f, dp, e,
              hv.q(t0), c3, 1.0f, dk, c3);
}

}  // namespace

void AttentionBackward(float* dinp, const float* dout, const float* inp,
                       const float* lse, int B, int T, int C, int NH) {
  EnsureBlasSingleThreaded();
  const int hs = C / NH;
  const float scale = 1.0f / sqrtf(static_cast<float>(hs));
  const size_t c3 = 3 * static_cast<size_t>(C);
#pragma omp parallel
  {
    const size_t scratch = Idx(std::min(T, kQueryBlock), T);
    float* p = Scratch(0, scratch);
    float* dp = Scratch(1, scratch);
    // Every query block of one (b, h) adds into its dk, dv: one iteration
    // per (b, h), blocks in order.
#pragma omp for collapse(2) schedule(dynamic, 1)
    for (int b = 0; b < B; b++) {
      for (int h = 0; h < NH; h++) {
        const HeadView hv = MakeHeadView(inp, b, h, T, C, NH);
        float* dqkv = dinp + Idx(static_cast<size_t>(b) * T, c3);
        const float* row_lse = lse + Idx(static_cast<size_t>(b) * NH + h, T);
        for (int t0 = 0; t0 < T; t0 += kQueryBlock) {
          const float* g =
              dout + Idx(static_cast<size_t>(b) * T + t0, C) + h * hs;
          AttentionBlockBackward(dqkv, hv, g, row_lse, t0,
                                 std::min(T, t0 + kQueryBlock), scale, p, dp);
        }
      }
    }
  }
}

// ------------------------------------------- GELU, residual, cross-entropy

namespace {

constexpr float kGeluScale = 0.7978845608028654f;  // sqrt(2/pi)
constexpr float kGeluCube = 0.044715f;
constexpr size_t kElementBlock = 4096;  // elements per OpenMP iteration

inline float Tanh(float u) { return 1.0f - 2.0f / (Exp(2.0f * u) + 1.0f); }

DSL_SIMD_CLONES void GeluForwardRange(float* out, const float* inp, size_t n) {
  for (size_t i = 0; i < n; i++) {
    const float x = inp[i];
    const float u = kGeluScale * (x + kGeluCube * x * x * x);
    out[i] = 0.5f * x * (1.0f + Tanh(u));
  }
}

DSL_SIMD_CLONES void GeluBackwardRange(float* dinp, const float* inp,
                                       const float* dout, size_t n) {
  for (size_t i = 0; i < n; i++) {
    const float x = inp[i];
    const float u = kGeluScale * (x + kGeluCube * x * x * x);
    const float th = Tanh(u);
    const float sech2 = 1.0f - th * th;
    const float grad =
        0.5f * (1.0f + th) +
        0.5f * x * sech2 * kGeluScale * (1.0f + 3.0f * kGeluCube * x * x);
    dinp[i] += grad * dout[i];
  }
}

}  // namespace

void GeluForward(float* out, const float* inp, size_t n) {
  const size_t blocks = (n + kElementBlock - 1) / kElementBlock;
#pragma omp parallel for schedule(static)
  for (size_t k = 0; k < blocks; k++) {
    const size_t i = k * kElementBlock;
    GeluForwardRange(out + i, inp + i, std::min(kElementBlock, n - i));
  }
}

void GeluBackward(float* dinp, const float* inp, const float* dout, size_t n) {
  const size_t blocks = (n + kElementBlock - 1) / kElementBlock;
#pragma omp parallel for schedule(static)
  for (size_t k = 0; k < blocks; k++) {
    const size_t i = k * kElementBlock;
    GeluBackwardRange(dinp + i, inp + i, dout + i,
                      std::min(kElementBlock, n - i));
  }
}

void ResidualForward(float* out, const float* inp1, const float* inp2,
                     size_t n) {
#pragma omp parallel for schedule(static)
  for (size_t i = 0; i < n; i++) out[i] = inp1[i] + inp2[i];
}

void ResidualBackward(float* dinp1, float* dinp2, const float* dout, size_t n) {
#pragma omp parallel for schedule(static)
  for (size_t i = 0; i < n; i++) {
    dinp1[i] += dout[i];
    dinp2[i] += dout[i];
  }
}

void CrossEntropySoftmaxForward(float* probs, float* losses,
                                const float* logits, const int* targets, int N,
                                int V, int Vp) {
#pragma omp parallel for schedule(static)
  for (int i = 0; i < N; i++) {
    const float* x = logits + Idx(i, Vp);
    float* p = probs + Idx(i, Vp);
    const float maxv = RowMax(x, V);
    // Read before p (maybe x) is overwritten.
    const float target_logit = targets != nullptr ? x[targets[i]] : 0.0f;
    const double sum = ExpShiftSum(p, x, V, maxv);
    if (targets != nullptr) {
      losses[i] = static_cast<float>(std::log(sum) - (target_logit - maxv));
    }
    ScaleRow(p, V, static_cast<float>(1.0 / sum));
    std::fill(p + V, p + Vp, 0.0f);
  }
}

void CrossEntropySoftmaxBackward(float* dlogits, const float* probs,
                                 const int* targets, float dloss, int N, int V,
                                 int Vp) {
#pragma omp parallel for schedule(static)
  for (int i = 0; i < N; i++) {
    const float* p = probs + Idx(i, Vp);
    float* d = dlogits + Idx(i, Vp);
    for (int v = 0; v < V; v++) d[v] = p[v] * dloss;
    d[targets[i]] -= dloss;
    for (int v = V; v < Vp; v++) d[v] = 0.0f;
  }
}

}  // namespace dslaunch::worker
