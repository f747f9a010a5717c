#include "worker/kernels_cpu.h"

#include <cblas.h>  // cblas_sgemm, openblas_get_corename (OpenBLAS)

#include <algorithm>         // std::min, std::max
#include <cmath>             // std::log, sqrtf
#include <cstdlib>           // std::getenv
#include <cstring>           // memcpy, strcmp
#include <initializer_list>  // RunGemms

#include "base/status.h"  // DSL_CHECK
#include "worker/vector_math.h"

namespace dslaunch::worker {
namespace {

// Reductions over rows (dweight, dbias, dwte) are split into blocks of
// columns, one block per OpenMP iteration: race-free and independent of the
// thread count.
constexpr int kColBlock = 64;

constexpr float kLayerNormEps = 1e-5f;

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
