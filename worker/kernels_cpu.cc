#include "worker/kernels_cpu.h"

#include <cblas.h>  // cblas_sgemm (OpenBLAS)

#include <algorithm>  // std::min, std::max
#include <cmath>      // expf, logf, tanhf, sqrtf
#include <cstring>    // memcpy, memset
#include <limits>     // infinity
#include <vector>     // per-thread attention scratch

namespace dslaunch::worker {
namespace {

// Reductions over rows (dweight, dbias, dwte) are split into blocks of
// columns, one block per OpenMP iteration: race-free and independent of the
// thread count.
constexpr int kColBlock = 64;

constexpr float kLayerNormEps = 1e-5f;

inline size_t Idx(size_t row, size_t width) { return row * width; }

// Dot product with 8 independent partial sums (vectorisable without
// -ffast-math).
inline float Dot(const float* a, const float* b, int n) {
  float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int i = 0;
  for (; i + 8 <= n; i += 8) {
    for (int j = 0; j < 8; j++) acc[j] += a[i + j] * b[i + j];
  }
  float sum = ((acc[0] + acc[1]) + (acc[2] + acc[3])) +
              ((acc[4] + acc[5]) + (acc[6] + acc[7]));
  for (; i < n; i++) sum += a[i] * b[i];
  return sum;
}

// y += alpha * x.
inline void Axpy(float* y, float alpha, const float* x, int n) {
  for (int i = 0; i < n; i++) y[i] += alpha * x[i];
}

}  // namespace

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

void LayerNormForward(float* out, float* mean, float* rstd, const float* inp,
                      const float* weight, const float* bias, int N, int C) {
#pragma omp parallel for schedule(static)
  for (int i = 0; i < N; i++) {
    const float* x = inp + Idx(i, C);
    float m = 0.0f;
    for (int c = 0; c < C; c++) m += x[c];
    m /= C;
    float v = 0.0f;
    for (int c = 0; c < C; c++) v += (x[c] - m) * (x[c] - m);
    v /= C;
    const float s = 1.0f / sqrtf(v + kLayerNormEps);
    float* o = out + Idx(i, C);
    for (int c = 0; c < C; c++) o[c] = (x[c] - m) * s * weight[c] + bias[c];
    mean[i] = m;
    rstd[i] = s;
  }
}

void LayerNormBackward(float* dinp, float* dweight, float* dbias,
                       const float* dout, const float* inp, const float* weight,
                       const float* mean, const float* rstd, int N, int C) {
#pragma omp parallel for schedule(static)
  for (int i = 0; i < N; i++) {
    const float* x = inp + Idx(i, C);
    const float* g = dout + Idx(i, C);
    const float m = mean[i], s = rstd[i];
    float dnorm_mean = 0.0f, dnorm_norm_mean = 0.0f;
    for (int c = 0; c < C; c++) {
      const float dnorm = weight[c] * g[c];
      dnorm_mean += dnorm;
      dnorm_norm_mean += dnorm * (x[c] - m) * s;
    }
    dnorm_mean /= C;
    dnorm_norm_mean /= C;
    float* d = dinp + Idx(i, C);
    for (int c = 0; c < C; c++) {
      const float norm = (x[c] - m) * s;
      d[c] += (weight[c] * g[c] - dnorm_mean - norm * dnorm_norm_mean) * s;
    }
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

void MatmulForward(float* out, const float* inp, const float* weight,
                   const float* bias, int N, int C, int OC) {
  float beta = 0.0f;
  if (bias != nullptr) {
#pragma omp parallel for schedule(static)
    for (int i = 0; i < N; i++) {
      std::memcpy(out + Idx(i, OC), bias, sizeof(float) * OC);
    }
    beta = 1.0f;
  }
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, N, OC, C, 1.0f, inp, C,
              weight, C, beta, out, OC);
}

void MatmulBackward(float* dinp, float* dweight, float* dbias,
                    const float* dout, const float* inp, const float* weight,
                    int N, int C, int OC) {
  if (dinp != nullptr) {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, N, C, OC, 1.0f, dout,
                OC, weight, C, 1.0f, dinp, C);
  }
  cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, OC, C, N, 1.0f, dout, OC,
              inp, C, 1.0f, dweight, C);
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

namespace {

// Geometry of the (B, T, 3C) qkv buffer for one (batch, head).
struct HeadView {
  const float* qkv;  // row t of this batch element starts at qkv + t * C3
  size_t c3;         // 3C
  int C, hs, h;
  const float* q(int t) const { return qkv + t * c3 + h * hs; }
  const float* k(int t) const { return qkv + t * c3 + C + h * hs; }
  const float* v(int t) const { return qkv + t * c3 + 2 * C + h * hs; }
};

HeadView MakeHeadView(const float* inp, int b, int h, int T, int C, int NH) {
  const size_t c3 = 3 * static_cast<size_t>(C);
  return HeadView{inp + static_cast<size_t>(b) * T * c3, c3, C, C / NH, h};
}

// One softmax row of the forward pass: scores of query t into sc[0..t],
// normalised in place; returns the log-sum-exp.
float SoftmaxRow(float* sc, const HeadView& hv, int t, float scale) {
  float maxv = -std::numeric_limits<float>::infinity();
  for (int t2 = 0; t2 <= t; t2++) {
    sc[t2] = Dot(hv.q(t), hv.k(t2), hv.hs) * scale;
    maxv = std::max(maxv, sc[t2]);
  }
  float sum = 0.0f;
  for (int t2 = 0; t2 <= t; t2++) {
    sc[t2] = expf(sc[t2] - maxv);
    sum += sc[t2];
  }
  const float inv = 1.0f / sum;
  for (int t2 = 0; t2 <= t; t2++) sc[t2] *= inv;
  return maxv + logf(sum);
}

}  // namespace

void AttentionForward(float* out, float* lse, const float* inp, int B, int T,
                      int C, int NH) {
  const int hs = C / NH;
  const float scale = 1.0f / sqrtf(static_cast<float>(hs));
#pragma omp parallel
  {
    std::vector<float> sc(T);
#pragma omp for collapse(3) schedule(static)
    for (int b = 0; b < B; b++) {
      for (int h = 0; h < NH; h++) {
        for (int t = 0; t < T; t++) {
          const HeadView hv = MakeHeadView(inp, b, h, T, C, NH);
          lse[(static_cast<size_t>(b) * NH + h) * T + t] =
              SoftmaxRow(sc.data(), hv, t, scale);
          float* o = out + Idx(static_cast<size_t>(b) * T + t, C) + h * hs;
          std::memset(o, 0, sizeof(float) * hs);
          for (int t2 = 0; t2 <= t; t2++) Axpy(o, sc[t2], hv.v(t2), hs);
        }
      }
    }
  }
}

namespace {

// Backward of one query row t of one head: recomputes its attention
// probabilities p from q, k and the saved lse, then accumulates into dq(t),
// dk(0..t), dv(0..t). p and dp are scratch of at least t+1 floats.
void AttentionRowBackward(float* dqkv, const HeadView& hv, const float* dout,
                          float lse, int t, float scale, float* p, float* dp) {
  float* dq = dqkv + t * hv.c3 + hv.h * hv.hs;
  float dsum = 0.0f;  // sum_t2 p * dp = d(loss)/d(softmax) . p
  for (int t2 = 0; t2 <= t; t2++) {
    p[t2] = expf(Dot(hv.q(t), hv.k(t2), hv.hs) * scale - lse);
    dp[t2] = Dot(dout, hv.v(t2), hv.hs);
    dsum += p[t2] * dp[t2];
  }
  for (int t2 = 0; t2 <= t; t2++) {
    float* dk = dqkv + t2 * hv.c3 + hv.C + hv.h * hv.hs;
    float* dv = dk + hv.C;
    Axpy(dv, p[t2], dout, hv.hs);
    const float ds = p[t2] * (dp[t2] - dsum) * scale;
    Axpy(dq, ds, hv.k(t2), hv.hs);
    Axpy(dk, ds, hv.q(t), hv.hs);
  }
}

}  // namespace

void AttentionBackward(float* dinp, const float* dout, const float* inp,
                       const float* lse, int B, int T, int C, int NH) {
  const int hs = C / NH;
  const float scale = 1.0f / sqrtf(static_cast<float>(hs));
  const size_t c3 = 3 * static_cast<size_t>(C);
#pragma omp parallel
  {
    std::vector<float> p(T), dp(T);
    // Rows of one (b, h) all write its dk, dv: one iteration per (b, h).
#pragma omp for collapse(2) schedule(static)
    for (int b = 0; b < B; b++) {
      for (int h = 0; h < NH; h++) {
        const HeadView hv = MakeHeadView(inp, b, h, T, C, NH);
        float* dqkv = dinp + static_cast<size_t>(b) * T * c3;
        const float* row_lse = lse + (static_cast<size_t>(b) * NH + h) * T;
        for (int t = 0; t < T; t++) {
          const float* g =
              dout + Idx(static_cast<size_t>(b) * T + t, C) + h * hs;
          AttentionRowBackward(dqkv, hv, g, row_lse[t], t, scale, p.data(),
                               dp.data());
        }
      }
    }
  }
}

namespace {
constexpr float kGeluScale = 0.7978845608028654f;  // sqrt(2/pi)
constexpr float kGeluCube = 0.044715f;
}  // namespace

void GeluForward(float* out, const float* inp, size_t n) {
#pragma omp parallel for schedule(static)
  for (size_t i = 0; i < n; i++) {
    const float x = inp[i];
    const float u = kGeluScale * (x + kGeluCube * x * x * x);
    out[i] = 0.5f * x * (1.0f + tanhf(u));
  }
}

void GeluBackward(float* dinp, const float* inp, const float* dout, size_t n) {
#pragma omp parallel for schedule(static)
  for (size_t i = 0; i < n; i++) {
    const float x = inp[i];
    const float u = kGeluScale * (x + kGeluCube * x * x * x);
    const float th = tanhf(u);
    const float sech2 = 1.0f - th * th;
    const float grad =
        0.5f * (1.0f + th) +
        0.5f * x * sech2 * kGeluScale * (1.0f + 3.0f * kGeluCube * x * x);
    dinp[i] += grad * dout[i];
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
    float maxv = -std::numeric_limits<float>::infinity();
    for (int v = 0; v < V; v++) maxv = std::max(maxv, x[v]);
    double sum = 0.0;
    for (int v = 0; v < V; v++) sum += expf(x[v] - maxv);
    if (targets != nullptr) {  // read before p (maybe x) is overwritten
      losses[i] = static_cast<float>(std::log(sum) - (x[targets[i]] - maxv));
    }
    const float inv = static_cast<float>(1.0 / sum);
    for (int v = 0; v < V; v++) p[v] = expf(x[v] - maxv) * inv;
    for (int v = V; v < Vp; v++) p[v] = 0.0f;
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
