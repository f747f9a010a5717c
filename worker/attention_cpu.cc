// Causal multi-head attention on the CPU (declared in kernels_cpu.h): blocks
// of query rows as cblas_sgemm calls, vectorised softmax rows, and a
// backward that recomputes the probabilities from the saved log-sum-exp.
#include <cblas.h>  // cblas_sgemm (OpenBLAS)

#include <algorithm>  // std::fill, std::min
#include <cmath>      // std::log
#include <vector>     // per-thread scratch

#include "worker/kernels_cpu.h"
#include "worker/vector_math.h"

namespace dslaunch::worker {
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

}  // namespace dslaunch::worker
