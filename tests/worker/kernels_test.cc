// Kernels of worker/kernels_cpu.h: each backward against central finite
// differences of its forward, the BLAS matmul against plain loops, the tiled
// GEMM against one cblas_sgemm call, and results independent of the OpenMP
// thread count.
#include <cblas.h>  // cblas_sgemm (the untiled yardstick), openblas_get_corename
#include <gtest/gtest.h>
#include <omp.h>  // omp_set_num_threads

#include <cmath>
#include <cstdlib>  // getenv, setenv, unsetenv
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "worker/kernels_cpu.h"

namespace dslaunch::worker {
namespace {

using Vec = std::vector<float>;

Vec Random(size_t n, uint32_t seed, float lo = -1.0f, float hi = 1.0f) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  Vec v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

double DotD(const Vec& a, const Vec& b) {
  double s = 0;
  for (size_t i = 0; i < a.size(); i++) s += static_cast<double>(a[i]) * b[i];
  return s;
}

// Checks grad[i] == d objective / d x[i] for every i by central differences.
// The objective re-runs the forward pass reading x.
void ExpectGradMatchesFd(Vec& x, const Vec& grad,
                         const std::function<double()>& objective,
                         const char* what, float eps = 1e-2f,
                         double atol = 2e-4, double rtol = 2e-3) {
  ASSERT_EQ(x.size(), grad.size());
  double worst = 0;
  for (size_t i = 0; i < x.size(); i++) {
    const float saved = x[i];
    x[i] = saved + eps;
    const double plus = objective();
    x[i] = saved - eps;
    const double minus = objective();
    x[i] = saved;
    const double fd = (plus - minus) / (2.0 * eps);
    const double err = std::fabs(fd - grad[i]);
    worst = std::max(worst, err);
    EXPECT_LE(err, atol + rtol * std::fabs(fd))
        << what << "[" << i << "]: analytic " << grad[i] << ", fd " << fd;
  }
  ::testing::Test::RecordProperty(what, std::to_string(worst));
}

// Runs fn with `threads` OpenMP threads, restoring the previous count.
template <typename Fn>
auto WithThreads(int threads, const Fn& fn) {
  const int saved = omp_get_max_threads();
  omp_set_num_threads(threads);
  auto result = fn();
  omp_set_num_threads(saved);
  return result;
}

// Shapes big enough for Gemm to cut C into several tiles (2 x 2 here).
constexpr int kTiledM = 700, kTiledN = 650, kTiledK = 300;

TEST(Gemm, TiledMatchesOneBlasCallForEveryTranspose) {
  const int M = kTiledM, N = kTiledN, K = kTiledK;
  for (Transpose ta : {Transpose::kNo, Transpose::kYes}) {
    for (Transpose tb : {Transpose::kNo, Transpose::kYes}) {
      // Leading dimensions with padding, as the model's strided views have.
      const int lda = (ta == Transpose::kYes ? M : K) + 3;
      const int ldb = (tb == Transpose::kYes ? K : N) + 5;
      const int ldc = N + 7;
      const Vec a = Random(static_cast<size_t>(lda) * std::max(M, K), 1);
      const Vec b = Random(static_cast<size_t>(ldb) * std::max(N, K), 2);
      Vec c = Random(static_cast<size_t>(ldc) * M, 3), ref = c;
      Gemm(ta, tb, M, N, K, 0.5f, a.data(), lda, b.data(), ldb, 1.0f, c.data(),
           ldc);
      cblas_sgemm(CblasRowMajor,
                  ta == Transpose::kYes ? CblasTrans : CblasNoTrans,
                  tb == Transpose::kYes ? CblasTrans : CblasNoTrans, M, N, K,
                  0.5f, a.data(), lda, b.data(), ldb, 1.0f, ref.data(), ldc);
      for (size_t i = 0; i < c.size(); i++) {
        ASSERT_NEAR(c[i], ref[i], 1e-4) << i;
      }
    }
  }
}

TEST(Gemm, SameBitsForOneTwoAndThreeThreads) {
  const int M = kTiledM, N = kTiledN, K = kTiledK;
  const Vec a = Random(static_cast<size_t>(K) * M, 1);
  const Vec b = Random(static_cast<size_t>(K) * N, 2);
  auto run = [&](int threads) {
    return WithThreads(threads, [&] {
      Vec c = Random(static_cast<size_t>(M) * N, 3);
      Gemm(Transpose::kYes, Transpose::kNo, M, N, K, 1.0f, a.data(), M,
           b.data(), N, 1.0f, c.data(), N);
      return c;
    });
  };
  const Vec one = run(1);
  EXPECT_EQ(one, run(2));
  EXPECT_EQ(one, run(3));
}

// A qkv-like layer (several tiles in every GEMM): forward and all three
// gradients have the same bits for 1 and 2 threads.
TEST(MatmulKernel, SameBitsForOneAndTwoThreads) {
  const int N = 512, C = 256, OC = 768;
  const Vec inp = Random(N * C, 1), w = Random(OC * C, 2), b = Random(OC, 3);
  const Vec dout = Random(N * OC, 4);
  auto run = [&](int threads) {
    return WithThreads(threads, [&] {
      Vec out(N * OC), dinp = Random(N * C, 5), dw = Random(OC * C, 6),
                       db = Random(OC, 7);
      MatmulForward(out.data(), inp.data(), w.data(), b.data(), N, C, OC);
      MatmulBackward(dinp.data(), dw.data(), db.data(), dout.data(), inp.data(),
                     w.data(), N, C, OC);
      return std::vector<Vec>{out, dinp, dw, db};
    });
  };
  const std::vector<Vec> one = run(1), two = run(2);
  for (size_t i = 0; i < one.size(); i++) EXPECT_EQ(one[i], two[i]) << i;
}

TEST(OpenBlasCoretype, NoOverrideWhenTheVariableIsSet) {
  const char* saved = std::getenv("OPENBLAS_CORETYPE");
  const std::string value = saved != nullptr ? saved : "";
  setenv("OPENBLAS_CORETYPE", "Haswell", 1);
  EXPECT_EQ(OpenBlasCoretypeOverride(), nullptr);
  if (saved != nullptr) {
    setenv("OPENBLAS_CORETYPE", value.c_str(), 1);
  } else {
    unsetenv("OPENBLAS_CORETYPE");
  }
  // Unset, it names a core only after OpenBLAS fell back to Prescott.
  const char* fix = OpenBlasCoretypeOverride();
  if (fix != nullptr) {
    EXPECT_STREQ(openblas_get_corename(), "Prescott");
  }
}

TEST(MatmulKernel, BlasForwardMatchesPlainLoops) {
  const int N = 7, C = 13, OC = 11;
  Vec inp = Random(N * C, 1), w = Random(OC * C, 2), b = Random(OC, 3);
  for (const float* bias : {static_cast<const float*>(b.data()),
                            static_cast<const float*>(nullptr)}) {
    Vec out(N * OC), ref(N * OC);
    MatmulForward(out.data(), inp.data(), w.data(), bias, N, C, OC);
    MatmulForwardReference(ref.data(), inp.data(), w.data(), bias, N, C, OC);
    for (size_t i = 0; i < out.size(); i++) EXPECT_NEAR(out[i], ref[i], 1e-5);
  }
}

TEST(MatmulKernel, BlasBackwardMatchesPlainLoopsAndAccumulates) {
  const int N = 9, C = 6, OC = 10;
  Vec inp = Random(N * C, 1), w = Random(OC * C, 2), dout = Random(N * OC, 3);
  // Non-zero starting gradients: both must add to them.
  Vec dinp = Random(N * C, 4), dw = Random(OC * C, 5), db = Random(OC, 6);
  Vec rinp = dinp, rw = dw, rb = db;
  MatmulBackward(dinp.data(), dw.data(), db.data(), dout.data(), inp.data(),
                 w.data(), N, C, OC);
  MatmulBackwardReference(rinp.data(), rw.data(), rb.data(), dout.data(),
                          inp.data(), w.data(), N, C, OC);
  for (size_t i = 0; i < dinp.size(); i++) EXPECT_NEAR(dinp[i], rinp[i], 1e-5);
  for (size_t i = 0; i < dw.size(); i++) EXPECT_NEAR(dw[i], rw[i], 1e-5);
  for (size_t i = 0; i < db.size(); i++) EXPECT_NEAR(db[i], rb[i], 1e-5);
}

TEST(MatmulKernel, BackwardMatchesFiniteDifferences) {
  const int N = 4, C = 5, OC = 3;
  Vec inp = Random(N * C, 1), w = Random(OC * C, 2), b = Random(OC, 3);
  const Vec dout = Random(N * OC, 4);
  Vec dinp(N * C), dw(OC * C), db(OC), out(N * OC);
  MatmulBackward(dinp.data(), dw.data(), db.data(), dout.data(), inp.data(),
                 w.data(), N, C, OC);
  auto objective = [&] {
    MatmulForwardReference(out.data(), inp.data(), w.data(), b.data(), N, C,
                           OC);
    return DotD(out, dout);
  };
  ExpectGradMatchesFd(inp, dinp, objective, "dinp");
  ExpectGradMatchesFd(w, dw, objective, "dweight");
  ExpectGradMatchesFd(b, db, objective, "dbias");
}

TEST(LayerNormKernel, NormalisesRows) {
  const int N = 3, C = 32;
  Vec inp = Random(N * C, 1, -3, 5), w(C, 1.0f), b(C, 0.0f);
  Vec out(N * C), mean(N), rstd(N);
  LayerNormForward(out.data(), mean.data(), rstd.data(), inp.data(), w.data(),
                   b.data(), N, C);
  for (int i = 0; i < N; i++) {
    double m = 0, v = 0;
    for (int c = 0; c < C; c++) m += out[i * C + c];
    for (int c = 0; c < C; c++) v += out[i * C + c] * out[i * C + c];
    EXPECT_NEAR(m / C, 0.0, 1e-5);
    EXPECT_NEAR(v / C, 1.0, 1e-3);  // 1 - eps/var
  }
}

TEST(LayerNormKernel, BackwardMatchesFiniteDifferences) {
  const int N = 3, C = 8;
  Vec inp = Random(N * C, 1, -2, 2), w = Random(C, 2, 0.5, 1.5),
      b = Random(C, 3);
  const Vec dout = Random(N * C, 4);
  Vec out(N * C), mean(N), rstd(N), dinp(N * C), dw(C), db(C);
  LayerNormForward(out.data(), mean.data(), rstd.data(), inp.data(), w.data(),
                   b.data(), N, C);
  LayerNormBackward(dinp.data(), dw.data(), db.data(), dout.data(), inp.data(),
                    w.data(), mean.data(), rstd.data(), N, C);
  auto objective = [&] {
    Vec m(N), r(N);
    LayerNormForward(out.data(), m.data(), r.data(), inp.data(), w.data(),
                     b.data(), N, C);
    return DotD(out, dout);
  };
  ExpectGradMatchesFd(inp, dinp, objective, "dinp");
  ExpectGradMatchesFd(w, dw, objective, "dweight");
  ExpectGradMatchesFd(b, db, objective, "dbias");
}

// Attention written the obvious way, in double: the full T x T score
// matrix per head, masked, softmaxed.
Vec NaiveAttention(const Vec& qkv, int B, int T, int C, int NH) {
  const int hs = C / NH;
  Vec out(static_cast<size_t>(B) * T * C);
  for (int b = 0; b < B; b++) {
    for (int h = 0; h < NH; h++) {
      for (int t = 0; t < T; t++) {
        std::vector<double> p(T, 0.0);
        double sum = 0;
        for (int u = 0; u <= t; u++) {
          double s = 0;
          for (int i = 0; i < hs; i++) {
            s += static_cast<double>(qkv[(b * T + t) * 3 * C + h * hs + i]) *
                 qkv[(b * T + u) * 3 * C + C + h * hs + i];
          }
          p[u] = std::exp(s / std::sqrt(static_cast<double>(hs)));
          sum += p[u];
        }
        for (int i = 0; i < hs; i++) {
          double o = 0;
          for (int u = 0; u <= t; u++) {
            o += p[u] / sum * qkv[(b * T + u) * 3 * C + 2 * C + h * hs + i];
          }
          out[(b * T + t) * C + h * hs + i] = static_cast<float>(o);
        }
      }
    }
  }
  return out;
}

void ExpectForwardMatchesNaive(int B, int T, int C, int NH) {
  const Vec qkv = Random(B * T * 3 * C, 1, -2, 2);
  Vec out(B * T * C), lse(B * NH * T);
  AttentionForward(out.data(), lse.data(), qkv.data(), B, T, C, NH);
  const Vec ref = NaiveAttention(qkv, B, T, C, NH);
  for (size_t i = 0; i < out.size(); i++) EXPECT_NEAR(out[i], ref[i], 1e-5);
}

TEST(AttentionKernel, ForwardMatchesNaiveSoftmaxAttention) {
  ExpectForwardMatchesNaive(2, 6, 12, 3);
}

TEST(AttentionKernel, IsCausal) {
  const int B = 1, T = 5, C = 8, NH = 2;
  Vec qkv = Random(B * T * 3 * C, 1);
  Vec out1(T * C), out2(T * C), lse(NH * T);
  AttentionForward(out1.data(), lse.data(), qkv.data(), B, T, C, NH);
  for (int c = 0; c < 3 * C; c++) qkv[(T - 1) * 3 * C + c] += 1.0f;
  AttentionForward(out2.data(), lse.data(), qkv.data(), B, T, C, NH);
  for (int i = 0; i < (T - 1) * C; i++) EXPECT_EQ(out1[i], out2[i]);
}

TEST(AttentionKernel, BackwardMatchesFiniteDifferences) {
  const int B = 2, T = 4, C = 8, NH = 2;
  Vec qkv = Random(B * T * 3 * C, 1, -1.5, 1.5);
  const Vec dout = Random(B * T * C, 2);
  Vec out(B * T * C), lse(B * NH * T), dqkv(B * T * 3 * C);
  AttentionForward(out.data(), lse.data(), qkv.data(), B, T, C, NH);
  AttentionBackward(dqkv.data(), dout.data(), qkv.data(), lse.data(), B, T, C,
                    NH);
  auto objective = [&] {
    Vec l(B * NH * T);
    AttentionForward(out.data(), l.data(), qkv.data(), B, T, C, NH);
    return DotD(out, dout);
  };
  ExpectGradMatchesFd(qkv, dqkv, objective, "dqkv");
}

// T spans three query blocks of the blocked kernel.
TEST(AttentionKernel, ForwardMatchesNaiveAcrossQueryBlocks) {
  ExpectForwardMatchesNaive(1, 300, 16, 2);
}

// Directional derivatives (a few random directions through all of qkv)
// against central differences, with T spanning three query blocks.
TEST(AttentionKernel, BackwardMatchesDirectionalDifferencesAcrossBlocks) {
  const int B = 2, T = 260, C = 16, NH = 2;
  Vec qkv = Random(B * T * 3 * C, 1, -1.5, 1.5);
  const Vec dout = Random(B * T * C, 2);
  Vec out(B * T * C), lse(B * NH * T), dqkv(B * T * 3 * C);
  AttentionForward(out.data(), lse.data(), qkv.data(), B, T, C, NH);
  AttentionBackward(dqkv.data(), dout.data(), qkv.data(), lse.data(), B, T, C,
                    NH);
  for (uint32_t seed = 10; seed < 13; seed++) {
    const Vec dir = Random(qkv.size(), seed);
    auto objective = [&](float eps) {
      Vec x = qkv, l(B * NH * T);
      for (size_t i = 0; i < x.size(); i++) x[i] += eps * dir[i];
      AttentionForward(out.data(), l.data(), x.data(), B, T, C, NH);
      return DotD(out, dout);
    };
    const float eps = 1e-2f;
    const double fd = (objective(eps) - objective(-eps)) / (2.0 * eps);
    const double analytic = DotD(dqkv, dir);
    EXPECT_NEAR(analytic, fd, 1e-3 * std::fabs(fd) + 1e-2) << seed;
  }
}

TEST(GeluKernel, ForwardMatchesTanhFormula) {
  const Vec x = {-3.0f, -1.0f, 0.0f, 0.5f, 1.0f, 4.0f};
  Vec y(x.size());
  GeluForward(y.data(), x.data(), x.size());
  for (size_t i = 0; i < x.size(); i++) {
    const double v = x[i];
    const double ref =
        0.5 * v *
        (1 + std::tanh(std::sqrt(2 / M_PI) * (v + 0.044715 * v * v * v)));
    EXPECT_NEAR(y[i], ref, 1e-6);
  }
}

// The vectorised tanh is within 2e-7 of the exact one, so GELU is within
// about |x| * 1e-7.
TEST(GeluKernel, ForwardMatchesTanhFormulaOnADenseGrid) {
  Vec x;
  for (double v = -12; v <= 12; v += 0.0037) x.push_back(static_cast<float>(v));
  Vec y(x.size());
  GeluForward(y.data(), x.data(), x.size());
  for (size_t i = 0; i < x.size(); i++) {
    const double v = x[i];
    const double ref =
        0.5 * v *
        (1 + std::tanh(std::sqrt(2 / M_PI) * (v + 0.044715 * v * v * v)));
    ASSERT_NEAR(y[i], ref, 1e-6 * std::max(1.0, std::fabs(v))) << v;
  }
}

TEST(GeluKernel, BackwardMatchesFiniteDifferences) {
  const size_t n = 40;
  Vec x = Random(n, 1, -4, 4);
  const Vec dout = Random(n, 2);
  Vec y(n), dx(n);
  GeluBackward(dx.data(), x.data(), dout.data(), n);
  auto objective = [&] {
    GeluForward(y.data(), x.data(), n);
    return DotD(y, dout);
  };
  ExpectGradMatchesFd(x, dx, objective, "dinp");
}

TEST(ResidualKernel, ForwardAddsBackwardFansOut) {
  const Vec a = {1, 2, 3}, b = {10, 20, 30}, dout = {0.5f, -1, 2};
  Vec out(3), da = {1, 1, 1}, db(3);
  ResidualForward(out.data(), a.data(), b.data(), 3);
  ResidualBackward(da.data(), db.data(), dout.data(), 3);
  EXPECT_EQ(out, (Vec{11, 22, 33}));
  EXPECT_EQ(da, (Vec{1.5f, 0, 3}));
  EXPECT_EQ(db, dout);
}

TEST(EncoderKernel, BackwardMatchesFiniteDifferencesWithRepeatedTokens) {
  const int B = 2, T = 3, C = 4, V = 5;
  const std::vector<int> tokens = {1, 3, 1, 4, 1, 0};  // token 1 three times
  Vec wte = Random(V * C, 1), wpe = Random(T * C, 2);
  const Vec dout = Random(B * T * C, 3);
  Vec out(B * T * C), dwte(V * C), dwpe(T * C);
  EncoderBackward(dwte.data(), dwpe.data(), dout.data(), tokens.data(), B, T,
                  C);
  auto objective = [&] {
    EncoderForward(out.data(), tokens.data(), wte.data(), wpe.data(), B, T, C);
    return DotD(out, dout);
  };
  ExpectGradMatchesFd(wte, dwte, objective, "dwte");
  ExpectGradMatchesFd(wpe, dwpe, objective, "dwpe");
  for (int c = 0; c < C; c++) EXPECT_EQ(dwte[2 * C + c], 0.0f);  // unused
}

TEST(CrossEntropyKernel, SoftmaxIgnoresPaddingAndLossIsNegLogProb) {
  const int N = 3, V = 5, Vp = 8;
  Vec logits = Random(N * Vp, 1, -3, 3);
  for (int i = 0; i < N; i++) logits[i * Vp + 6] = 100.0f;  // padding
  const std::vector<int> targets = {0, 4, 2};
  Vec probs(N * Vp), losses(N);
  CrossEntropySoftmaxForward(probs.data(), losses.data(), logits.data(),
                             targets.data(), N, V, Vp);
  for (int i = 0; i < N; i++) {
    double sum = 0;
    for (int v = 0; v < V; v++) sum += probs[i * Vp + v];
    EXPECT_NEAR(sum, 1.0, 1e-6);
    for (int v = V; v < Vp; v++) EXPECT_EQ(probs[i * Vp + v], 0.0f);
    EXPECT_NEAR(losses[i], -std::log(probs[i * Vp + targets[i]]), 1e-5);
  }
  // In place gives the same bits.
  Vec inplace = logits, losses2(N);
  CrossEntropySoftmaxForward(inplace.data(), losses2.data(), inplace.data(),
                             targets.data(), N, V, Vp);
  EXPECT_EQ(inplace, probs);
  EXPECT_EQ(losses2, losses);
}

// Logits spread over [-100, 100]: most probabilities underflow, the rest
// must match a double softmax.
TEST(CrossEntropyKernel, MatchesDoubleSoftmaxOverAWideRange) {
  const int N = 4, V = 3000, Vp = 3008;
  const Vec logits = Random(N * Vp, 1, -100, 100);
  std::vector<int> targets = {0, 1, 2, 3};
  Vec probs(N * Vp), losses(N);
  CrossEntropySoftmaxForward(probs.data(), losses.data(), logits.data(),
                             targets.data(), N, V, Vp);
  for (int i = 0; i < N; i++) {
    const float* x = logits.data() + i * Vp;
    const double maxv = *std::max_element(x, x + V);
    double sum = 0;
    for (int v = 0; v < V; v++) sum += std::exp(x[v] - maxv);
    for (int v = 0; v < V; v++) {
      const double ref = std::exp(x[v] - maxv) / sum;
      ASSERT_NEAR(probs[i * Vp + v], ref, 1e-6 * ref + 1e-30) << i << " " << v;
    }
    EXPECT_NEAR(losses[i], std::log(sum) - (x[targets[i]] - maxv), 1e-5);
  }
}

TEST(CrossEntropyKernel, BackwardMatchesFiniteDifferences) {
  const int N = 3, V = 6, Vp = 8;
  const float dloss = 0.7f;
  Vec logits = Random(N * Vp, 1, -2, 2);
  const std::vector<int> targets = {5, 0, 3};
  Vec probs(N * Vp), losses(N), dlogits(N * Vp, 42.0f);  // written, not added
  CrossEntropySoftmaxForward(probs.data(), losses.data(), logits.data(),
                             targets.data(), N, V, Vp);
  CrossEntropySoftmaxBackward(dlogits.data(), probs.data(), targets.data(),
                              dloss, N, V, Vp);
  auto objective = [&] {
    Vec p(N * Vp), l(N);
    CrossEntropySoftmaxForward(p.data(), l.data(), logits.data(),
                               targets.data(), N, V, Vp);
    double s = 0;
    for (float x : l) s += dloss * static_cast<double>(x);
    return s;
  };
  ExpectGradMatchesFd(logits, dlogits, objective, "dlogits");
  for (int i = 0; i < N; i++) {
    for (int v = V; v < Vp; v++) EXPECT_EQ(dlogits[i * Vp + v], 0.0f);
  }
}

// Every reduction is split by output element, so 1 and 3 threads agree to
// the bit. T spans several attention query blocks.
TEST(Kernels, BackwardIsIndependentOfThreadCount) {
  const int B = 2, T = 200, C = 64, NH = 4, V = 7;
  const Vec x = Random(B * T * C, 1), w = Random(C, 2),
            dout = Random(B * T * C, 3);
  const Vec qkv = Random(B * T * 3 * C, 4);
  std::vector<int> tokens(B * T);
  for (int i = 0; i < B * T; i++) tokens[i] = (i * 5) % V;
  auto run = [&](int threads) {
    return WithThreads(threads, [&] {
      Vec mean(B * T), rstd(B * T), out(B * T * C), lse(B * NH * T);
      Vec dx(B * T * C), dw(C), db(C), dwte(V * C), dwpe(T * C);
      Vec dqkv(B * T * 3 * C), attout(B * T * C);
      Vec gelu(B * T * C), dgelu(B * T * C), probs(B * T * C),
          dlogits(B * T * C);
      Vec losses(B * T);
      LayerNormForward(out.data(), mean.data(), rstd.data(), x.data(), w.data(),
                       w.data(), B * T, C);
      LayerNormBackward(dx.data(), dw.data(), db.data(), dout.data(), x.data(),
                        w.data(), mean.data(), rstd.data(), B * T, C);
      EncoderBackward(dwte.data(), dwpe.data(), dout.data(), tokens.data(), B,
                      T, C);
      AttentionForward(attout.data(), lse.data(), qkv.data(), B, T, C, NH);
      AttentionBackward(dqkv.data(), dout.data(), qkv.data(), lse.data(), B, T,
                        C, NH);
      GeluForward(gelu.data(), x.data(), x.size());
      GeluBackward(dgelu.data(), x.data(), dout.data(), x.size());
      // Rows of C logits over a vocabulary of C - 3 (3 padding columns).
      CrossEntropySoftmaxForward(probs.data(), losses.data(), x.data(),
                                 tokens.data(), B * T, C - 3, C);
      CrossEntropySoftmaxBackward(dlogits.data(), probs.data(), tokens.data(),
                                  0.5f, B * T, C - 3, C);
      return std::vector<Vec>{out,   mean,  rstd,   dx,     dw,  db,
                              dwte,  dwpe,  dqkv,   attout, lse, gelu,
                              dgelu, probs, losses, dlogits};
    });
  };
  const std::vector<Vec> one = run(1);
  const std::vector<Vec> three = run(3);
  for (size_t i = 0; i < one.size(); i++) EXPECT_EQ(one[i], three[i]) << i;
}

}  // namespace
}  // namespace dslaunch::worker
