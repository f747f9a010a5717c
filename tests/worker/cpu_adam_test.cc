#include "worker/cpu_adam.h"

#include <gtest/gtest.h>
#include <omp.h>  // omp_get_max_threads, omp_set_num_threads

#include <algorithm>  // std::fill
#include <cmath>      // std::sqrt, std::pow, std::fabs
#include <cstdlib>    // setenv, std::exit
#include <cstring>    // std::memcmp
#include <random>
#include <tuple>
#include <vector>

namespace dslaunch::worker {
namespace {

// One optimizer's buffers: parameters, gradients and both moments.
struct State {
  std::vector<float> p, g, m, v;
};

// Gradients and moments at the scales training sees (p ~ 1, g ~ 1e-2).
State RandomState(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_real_distribution<float> uniform(0.0f, 1.0f);
  State s{std::vector<float>(n), std::vector<float>(n), std::vector<float>(n),
          std::vector<float>(n)};
  for (size_t i = 0; i < n; ++i) {
    s.p[i] = normal(rng);
    s.g[i] = 1e-2f * normal(rng);
    s.m[i] = 1e-3f * normal(rng);
    s.v[i] = 1e-4f * uniform(rng);
  }
  return s;
}

void Step(AdamIsa isa, State* s, const AdamParams& hp, bool apply_decay) {
  AdamStepWithIsa(isa, s->p.data(), s->g.data(), s->m.data(), s->v.data(),
                  s->p.size(), hp, apply_decay);
}

::testing::AssertionResult SameBits(const std::vector<float>& got,
                                    const std::vector<float>& want) {
  if (got.size() != want.size()) {
    return ::testing::AssertionFailure()
           << "sizes " << got.size() << " and " << want.size();
  }
  for (size_t i = 0; i < got.size(); ++i) {
    if (std::memcmp(&got[i], &want[i], sizeof(float)) != 0) {
      return ::testing::AssertionFailure()
             << "element " << i << ": " << got[i] << " vs " << want[i];
    }
  }
  return ::testing::AssertionSuccess();
}

::testing::AssertionResult SameState(const State& got, const State& want) {
  for (auto [a, b, name] :
       {std::tuple{&got.p, &want.p, "p"}, std::tuple{&got.m, &want.m, "m"},
        std::tuple{&got.v, &want.v, "v"}}) {
    ::testing::AssertionResult r = SameBits(*a, *b);
    if (!r) return r << " (" << name << ")";
  }
  return ::testing::AssertionSuccess();
}

std::vector<AdamIsa> SupportedVectorIsas() {
  std::vector<AdamIsa> isas;
  for (AdamIsa isa : {AdamIsa::kAvx2, AdamIsa::kAvx512}) {
    if (CpuSupportsAdamIsa(isa)) isas.push_back(isa);
  }
  return isas;
}

// ---- Double-precision reference of PyTorch's expressions ----

struct RefState {
  std::vector<double> p, m, v;
};

RefState ToDouble(const State& s) {
  return {{s.p.begin(), s.p.end()},
          {s.m.begin(), s.m.end()},
          {s.v.begin(), s.v.end()}};
}

// torch.optim.AdamW / Adam (single-tensor path), all in double.
void ReferenceStep(RefState* s, const std::vector<float>& grads,
                   const AdamParams& hp, bool apply_decay) {
  const double bc1 = 1.0 - std::pow(hp.beta1, static_cast<double>(hp.step));
  const double bc2 = 1.0 - std::pow(hp.beta2, static_cast<double>(hp.step));
  const double wd = apply_decay ? hp.weight_decay : 0.0;
  for (size_t i = 0; i < grads.size(); ++i) {
    double g = grads[i];
    if (hp.adamw_mode) {
      s->p[i] *= 1.0 - hp.lr * wd;
    } else {
      g += wd * s->p[i];
    }
    s->m[i] = hp.beta1 * s->m[i] + (1.0 - hp.beta1) * g;
    s->v[i] = hp.beta2 * s->v[i] + (1.0 - hp.beta2) * g * g;
    const double denom = std::sqrt(s->v[i]) / std::sqrt(bc2) + hp.eps;
    s->p[i] += -(hp.lr / bc1) * s->m[i] / denom;
  }
}

// |got - want| <= rtol*|want| + atol for every element.
::testing::AssertionResult Near(const std::vector<float>& got,
                                const std::vector<double>& want, double rtol,
                                double atol) {
  for (size_t i = 0; i < got.size(); ++i) {
    const double err = std::fabs(got[i] - want[i]);
    if (err > rtol * std::fabs(want[i]) + atol) {
      return ::testing::AssertionFailure()
             << "element " << i << ": " << got[i] << " vs " << want[i];
    }
  }
  return ::testing::AssertionSuccess();
}

// Five steps with fresh gradients against the double reference. Tolerances:
// fp32 rounds every operation (2^-24 relative) and every constant once; five
// steps accumulate at most a few ulps in p and v (no cancellation there). m
// can cancel (b1*m + (1-b1)*g near 0), so its bound is absolute: about ten
// roundings (2^-24 each) of terms up to ~3e-3 (|0.9*m|, |0.1*g|).
void ExpectMatchesReference(const AdamParams& base, bool apply_decay) {
  State s = RandomState(4099, 7);
  RefState ref = ToDouble(s);
  std::mt19937 rng(11);
  std::normal_distribution<float> normal(0.0f, 1e-2f);
  for (int64_t step = 1; step <= 5; ++step) {
    for (float& g : s.g) g = normal(rng);
    AdamParams hp = base;
    hp.step = step;
    Step(AdamIsa::kScalar, &s, hp, apply_decay);
    ReferenceStep(&ref, s.g, hp, apply_decay);
  }
  EXPECT_TRUE(Near(s.p, ref.p, 1e-6, 1e-9));
  EXPECT_TRUE(Near(s.m, ref.m, 1e-6, 2e-9));
  EXPECT_TRUE(Near(s.v, ref.v, 1e-6, 1e-14));
}

TEST(CpuAdam, AdamWMatchesDoubleReferenceOverSteps) {
  ExpectMatchesReference({.lr = 1e-3, .weight_decay = 0.1}, true);
}

TEST(CpuAdam, AdamWWithoutDecayMatchesDoubleReference) {
  ExpectMatchesReference({.lr = 1e-3, .weight_decay = 0.1}, false);
  ExpectMatchesReference({.lr = 1e-3, .weight_decay = 0.0}, true);
}

TEST(CpuAdam, AdamL2ModeMatchesDoubleReference) {
  ExpectMatchesReference({.lr = 1e-3, .weight_decay = 0.1, .adamw_mode = false},
                         true);
  ExpectMatchesReference({.lr = 1e-3, .weight_decay = 0.1, .adamw_mode = false},
                         false);
}

// ---- Bit-for-bit against torch 1.13 ----

// Three steps of torch.optim.AdamW / Adam(lr=0.01, weight_decay=0.1) from zero
// moments, Debian's torch 1.13.1 on an AVX2 CPU; inputs are exact in fp32:
// p_i = (i % 7 - 3) / 8, g_i at step s = ((3i + 5s) % 11 - 5) / 32.
constexpr size_t kGoldenN = 19;
// clang-format off
constexpr float kTorchAdamWP[kGoldenN] = {-0x1.8af42ap-2f, -0x1.0b54p-2f, -0x1.bdafbcp-4f, 0x1.4ba8b8p-7f, 0x1.008224p-3f, 0x1.d9c8b2p-3f, 0x1.95486cp-2f, -0x1.7b7b3cp-2f, -0x1.044eb4p-2f, -0x1.2c91e6p-3f, 0x1.152ffcp-6f, 0x1.ce0c14p-4f, 0x1.e6465ep-3f, 0x1.8f0b3ep-2f, -0x1.747c1cp-2f, -0x1.fd30a4p-3f, -0x1.23ea14p-3f, 0x1.66f09ep-6f, 0x1.05f7e4p-3f};
constexpr float kTorchAdamWM[kGoldenN] = {0x1.666666p-7f, 0x1.624dd4p-8f, 0x1.851ec2p-9f, -0x1.89374cp-8f, -0x1.79db24p-7f, 0x1.c6a7eep-7f, -0x1.77ced8p-6f, 0x1.43957cp-9f, -0x1.916876p-9f, 0x1.6e147cp-6f, -0x1.da1cacp-7f, 0x1.666666p-7f, 0x1.624dd4p-8f, 0x1.851ec2p-9f, -0x1.89374cp-8f, -0x1.79db24p-7f, 0x1.c6a7eep-7f, -0x1.77ced8p-6f, 0x1.43957cp-9f};
constexpr float kTorchAdamWV[kGoldenN] = {0x1.a9930ep-16f, 0x1.68017ap-16f, 0x1.9930cep-15f, 0x1.682b68p-16f, 0x1.a98aacp-16f, 0x1.da8be4p-16f, 0x1.57cb38p-15f, 0x1.57c4e6p-16f, 0x1.57abbep-16f, 0x1.57a57cp-15f, 0x1.dac694p-16f, 0x1.a9930ep-16f, 0x1.68017ap-16f, 0x1.9930cep-15f, 0x1.682b68p-16f, 0x1.a98aacp-16f, 0x1.da8be4p-16f, 0x1.57cb38p-15f, 0x1.57c4e6p-16f};
constexpr float kTorchAdamP[kGoldenN] = {-0x1.7b66bap-2f, -0x1.06589ep-2f, -0x1.b9668cp-4f, 0x1.483b76p-7f, 0x1.fa92e6p-4f, 0x1.d44344p-3f, 0x1.8fec04p-2f, -0x1.74481cp-2f, -0x1.004e48p-2f, -0x1.2a26bap-3f, 0x1.135322p-6f, 0x1.a0e482p-4f, 0x1.ddc486p-3f, 0x1.8aa43ap-2f, -0x1.6d95e6p-2f, -0x1.f89eaap-3f, -0x1.1fdafap-3f, 0x1.659884p-6f, 0x1.01f074p-3f};
constexpr float kTorchAdamM[kGoldenN] = {0x1.df32d6p-11f, -0x1.907094p-10f, -0x1.48e97cp-13f, -0x1.7e6b24p-8f, -0x1.0f618ep-7f, 0x1.4e74e2p-6f, -0x1.9c306ap-7f, -0x1.ececb4p-8f, -0x1.46be52p-7f, 0x1.32c7d8p-6f, -0x1.d36fb8p-7f, 0x1.cc94bcp-7f, 0x1.88458ep-7f, 0x1.b5d8dp-7f, -0x1.0558c8p-6f, -0x1.2ddc98p-6f, 0x1.50f98cp-7f, -0x1.73efd2p-6f, 0x1.8800cep-8f};
constexpr float kTorchAdamV[kGoldenN] = {0x1.561056p-16f, 0x1.56388ep-16f, 0x1.a105e8p-15f, 0x1.68fc96p-16f, 0x1.81a562p-16f, 0x1.3c2e92p-15f, 0x1.ba1d72p-16f, 0x1.776ef4p-16f, 0x1.96445ep-16f, 0x1.25493cp-15f, 0x1.d823aap-16f, 0x1.e155e2p-16f, 0x1.ba9a28p-16f, 0x1.c1f886p-15f, 0x1.fa12a2p-16f, 0x1.1c0984p-15f, 0x1.a064f4p-16f, 0x1.54825ep-15f, 0x1.70be48p-16f};
// clang-format on

State GoldenRun(AdamIsa isa, bool adamw_mode) {
  State s{std::vector<float>(kGoldenN), std::vector<float>(kGoldenN),
          std::vector<float>(kGoldenN, 0.0f),
          std::vector<float>(kGoldenN, 0.0f)};
  for (size_t i = 0; i < kGoldenN; ++i) s.p[i] = (int(i % 7) - 3) / 8.0f;
  for (int64_t step = 1; step <= 3; ++step) {
    for (size_t i = 0; i < kGoldenN; ++i) {
      s.g[i] = (int((3 * i + 5 * step) % 11) - 5) / 32.0f;
    }
    const AdamParams hp{.lr = 0.01,
                        .weight_decay = 0.1,
                        .adamw_mode = adamw_mode,
                        .step = step};
    Step(isa, &s, hp, true);
  }
  return s;
}

std::vector<float> Vec(const float (&a)[kGoldenN]) {
  return std::vector<float>(a, a + kGoldenN);
}

TEST(CpuAdam, EveryIsaReproducesTorchBitForBit) {
  for (AdamIsa isa : {AdamIsa::kScalar, AdamIsa::kAvx2, AdamIsa::kAvx512}) {
    if (!CpuSupportsAdamIsa(isa)) continue;
    SCOPED_TRACE(AdamIsaName(isa));
    const State adamw = GoldenRun(isa, true);
    EXPECT_TRUE(SameBits(adamw.p, Vec(kTorchAdamWP)));
    EXPECT_TRUE(SameBits(adamw.m, Vec(kTorchAdamWM)));
    EXPECT_TRUE(SameBits(adamw.v, Vec(kTorchAdamWV)));
    const State adam = GoldenRun(isa, false);
    EXPECT_TRUE(SameBits(adam.p, Vec(kTorchAdamP)));
    EXPECT_TRUE(SameBits(adam.m, Vec(kTorchAdamM)));
    EXPECT_TRUE(SameBits(adam.v, Vec(kTorchAdamV)));
  }
}

// ---- ISAs, sizes and threads ----

TEST(CpuAdam, VectorIsasMatchScalarBitForBit) {
  const std::vector<AdamIsa> isas = SupportedVectorIsas();
  if (isas.empty()) GTEST_SKIP() << "this CPU has neither AVX2+FMA nor AVX-512";
  const size_t sizes[] = {1, 2, 7, 8, 9, 15, 16, 17, 31, 33, 1000, 40961};
  for (size_t n : sizes) {
    for (bool adamw : {true, false}) {
      for (bool decay : {true, false}) {
        const AdamParams hp{
            .weight_decay = 0.05, .adamw_mode = adamw, .step = 3};
        State want = RandomState(n, static_cast<uint32_t>(n));
        const State input = want;
        Step(AdamIsa::kScalar, &want, hp, decay);
        for (AdamIsa isa : isas) {
          SCOPED_TRACE(::testing::Message()
                       << AdamIsaName(isa) << " n=" << n << " adamw=" << adamw
                       << " decay=" << decay);
          State got = input;
          Step(isa, &got, hp, decay);
          EXPECT_TRUE(SameState(got, want));
        }
      }
    }
  }
}

TEST(CpuAdam, ZeroElementsTouchesNothing) {
  for (AdamIsa isa : {AdamIsa::kScalar, AdamIsa::kAvx2, AdamIsa::kAvx512}) {
    if (!CpuSupportsAdamIsa(isa)) continue;
    AdamStepWithIsa(isa, nullptr, nullptr, nullptr, nullptr, 0, AdamParams{},
                    true);
  }
  State s = RandomState(4, 3);
  const State before = s;
  AdamStep(s.p.data(), s.g.data(), s.m.data(), s.v.data(), 0, AdamParams{},
           true);
  EXPECT_TRUE(SameState(s, before));
}

TEST(CpuAdam, VectorTailWritesNoElementPastN) {
  for (AdamIsa isa : SupportedVectorIsas()) {
    SCOPED_TRACE(AdamIsaName(isa));
    State s = RandomState(32, 5);
    const State before = s;
    AdamStepWithIsa(isa, s.p.data(), s.g.data(), s.m.data(), s.v.data(), 3,
                    AdamParams{}, true);
    for (size_t i = 3; i < 32; ++i) {
      EXPECT_EQ(s.p[i], before.p[i]) << i;
      EXPECT_EQ(s.m[i], before.m[i]) << i;
      EXPECT_EQ(s.v[i], before.v[i]) << i;
    }
  }
}

TEST(CpuAdam, DecoupledDecayAloneScalesParams) {
  // With g = m = v = 0 the update is 0 / eps, so only p * (1 - lr*wd) remains.
  State s = RandomState(100, 9);
  std::fill(s.g.begin(), s.g.end(), 0.0f);
  std::fill(s.m.begin(), s.m.end(), 0.0f);
  std::fill(s.v.begin(), s.v.end(), 0.0f);
  const State before = s;
  const AdamParams hp{.lr = 0.01, .weight_decay = 0.5};
  Step(AdamIsa::kScalar, &s, hp, true);
  const float decay = static_cast<float>(1.0 - 0.01 * 0.5);
  for (size_t i = 0; i < s.p.size(); ++i)
    EXPECT_EQ(s.p[i], before.p[i] * decay);
  Step(AdamIsa::kScalar, &s, hp, false);
  for (size_t i = 0; i < s.p.size(); ++i)
    EXPECT_EQ(s.p[i], before.p[i] * decay);
}

TEST(CpuAdam, NoDecayRangeEqualsZeroWeightDecay) {
  for (bool adamw : {true, false}) {
    State a = RandomState(1001, 2);
    State b = a;
    Step(ActiveAdamIsa(), &a, {.weight_decay = 0.3, .adamw_mode = adamw},
         false);
    Step(ActiveAdamIsa(), &b, {.weight_decay = 0.0, .adamw_mode = adamw}, true);
    EXPECT_TRUE(SameState(a, b)) << "adamw=" << adamw;
  }
}

TEST(CpuAdam, ResultDoesNotDependOnThreadCount) {
  const int saved = omp_get_max_threads();
  const State input = RandomState(300007, 4);  // above the parallel threshold
  std::vector<State> results;
  for (int threads : {1, 2, 3}) {
    omp_set_num_threads(threads);
    State s = input;
    AdamStep(s.p.data(), s.g.data(), s.m.data(), s.v.data(), s.p.size(),
             {.step = 2}, true);
    results.push_back(std::move(s));
  }
  omp_set_num_threads(saved);
  EXPECT_TRUE(SameState(results[1], results[0]));
  EXPECT_TRUE(SameState(results[2], results[0]));
}

// Clipping's scale applied in the kernels: the bits of scaling the
// gradients first, the gradient buffer left as it was.
TEST(CpuAdam, GradScaleEqualsScalingTheGradientsFirst) {
  std::vector<AdamIsa> isas = SupportedVectorIsas();
  isas.push_back(AdamIsa::kScalar);
  for (AdamIsa isa : isas) {
    for (bool adamw : {true, false}) {
      const State input = RandomState(1003, 6);  // a vector tail
      State prescaled = input, scaled = input;
      for (float& g : prescaled.g) g *= 0.37f;
      Step(isa, &prescaled, {.adamw_mode = adamw, .step = 3}, true);
      Step(isa, &scaled, {.adamw_mode = adamw, .step = 3, .grad_scale = 0.37f},
           true);
      EXPECT_TRUE(SameState(scaled, prescaled)) << AdamIsaName(isa);
      EXPECT_TRUE(SameBits(scaled.g, input.g)) << AdamIsaName(isa);
    }
  }
}

// ---- Choosing the ISA ----

TEST(CpuAdamIsa, ResolvePicksWidestOrTheNamedOne) {
  ASSERT_TRUE(ResolveAdamIsa(nullptr).ok());
  const AdamIsa widest = *ResolveAdamIsa(nullptr);
  EXPECT_TRUE(CpuSupportsAdamIsa(widest));
  EXPECT_EQ(*ResolveAdamIsa(""), widest);
  EXPECT_EQ(*ResolveAdamIsa("scalar"), AdamIsa::kScalar);
  for (AdamIsa isa : {AdamIsa::kAvx2, AdamIsa::kAvx512}) {
    StatusOr<AdamIsa> r = ResolveAdamIsa(AdamIsaName(isa));
    EXPECT_EQ(r.ok(), CpuSupportsAdamIsa(isa)) << AdamIsaName(isa);
    if (r.ok()) {
      EXPECT_EQ(*r, isa);
    }
  }
}

TEST(CpuAdamIsa, ResolveRejectsUnknownName) {
  StatusOr<AdamIsa> r = ResolveAdamIsa("sse2");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(r.status().message(),
            "DSL_CPU_ADAM_ISA=sse2: expected scalar, avx2 or avx512");
}

// The choice is made once per process, so these run in a fresh child.
TEST(CpuAdamIsa, EnvironmentVariableForcesTheIsa) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        setenv("DSL_CPU_ADAM_ISA", "scalar", 1);
        std::exit(ActiveAdamIsa() == AdamIsa::kScalar ? 0 : 1);
      },
      ::testing::ExitedWithCode(0), "");
  EXPECT_DEATH(
      {
        setenv("DSL_CPU_ADAM_ISA", "neon", 1);
        (void)ActiveAdamIsa();
      },
      "DSL_CPU_ADAM_ISA=neon: expected scalar, avx2 or avx512");
}

}  // namespace
}  // namespace dslaunch::worker
