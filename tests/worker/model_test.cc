// The GPT-2 model of worker/model.h: forward results, whole-model gradients
// against finite differences, gradient accumulation and per-layer hooks.
#include "worker/model.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "tests/worker/model_test_util.h"

namespace dslaunch::worker {
namespace {

// Mean loss recomputed in double from the per-token losses (less rounding
// than the float return value, for finite differences).
double LossD(Model& m, const Batch& b) {
  Forward(m, b);
  double s = 0;
  for (float x : m.losses()) s += x;
  return s / m.losses().size();
}

TEST(Model, LossAtInitIsCloseToLogVocab) {
  auto m = NewModel(Tiny(), 1);
  const float loss = Forward(*m, MakeBatch(Tiny(), 2, 5, 1));
  EXPECT_NEAR(loss, std::log(67.0), 0.02);
}

TEST(Model, InferenceGivesProbabilitiesOverTheRealVocabulary) {
  auto m = NewModel(Tiny(), 1);
  Perturb(*m, 2);
  const Batch b = MakeBatch(Tiny(), 2, 5, 1);
  EXPECT_EQ(m->Forward(b.tokens.data(), nullptr, 2, 5), -1.0f);
  for (int i = 0; i < 10; i++) {
    std::span<const float> row = m->probs().subspan(i * 128, 128);
    double sum = 0;
    for (int v = 0; v < 67; v++) sum += row[v];
    EXPECT_NEAR(sum, 1.0, 1e-5);
    for (int v = 67; v < 128; v++) EXPECT_EQ(row[v], 0.0f);
  }
}

TEST(Model, LaterTokensDoNotChangeEarlierLosses) {
  auto m = NewModel(Tiny(), 1);
  Perturb(*m, 2);
  Batch b = MakeBatch(Tiny(), 1, 6, 1);
  Forward(*m, b);
  const std::vector<float> before(m->losses().begin(), m->losses().end());
  b.tokens[4] = (b.tokens[4] + 1) % 67;
  Forward(*m, b);
  for (int t = 0; t < 4; t++) EXPECT_FLOAT_EQ(m->losses()[t], before[t]);
  EXPECT_NE(m->losses()[4], before[4]);
}

TEST(Model, ResizeKeepsResultsAndReusesMemory) {
  auto m = NewModel(Tiny(), 1);
  const Batch small = MakeBatch(Tiny(), 2, 3, 1),
              big = MakeBatch(Tiny(), 2, 5, 2);
  const float loss_small = Forward(*m, small);
  Forward(*m, big);
  const size_t floats = m->num_activation_floats();
  EXPECT_EQ(Forward(*m, small), loss_small);
  EXPECT_EQ(m->num_activation_floats(), floats);  // capacity kept
  EXPECT_EQ(m->batch_size(), 2);
  EXPECT_EQ(m->seq_len(), 3);
}

// The central difference of the mean loss along direction `dir`.
double DirectionalFd(Model& m, const Batch& b, size_t begin,
                     const std::vector<float>& dir, float eps) {
  std::span<float> p = m.params().subspan(begin, dir.size());
  const std::vector<float> saved(p.begin(), p.end());
  for (size_t i = 0; i < p.size(); i++) p[i] = saved[i] + eps * dir[i];
  const double plus = LossD(m, b);
  for (size_t i = 0; i < p.size(); i++) p[i] = saved[i] - eps * dir[i];
  const double minus = LossD(m, b);
  std::copy(saved.begin(), saved.end(), p.begin());
  return (plus - minus) / (2.0 * eps);
}

// Indices of the two largest |grad| and two random elements of a range.
std::vector<size_t> Sample(std::span<const float> g, size_t begin,
                           std::mt19937& rng) {
  std::vector<size_t> idx(g.size());
  for (size_t i = 0; i < idx.size(); i++) idx[i] = i;
  std::partial_sort(
      idx.begin(), idx.begin() + 2, idx.end(),
      [&](size_t a, size_t b) { return std::fabs(g[a]) > std::fabs(g[b]); });
  std::uniform_int_distribution<size_t> pick(0, g.size() - 1);
  return {begin + idx[0], begin + idx[1], begin + pick(rng), begin + pick(rng)};
}

TEST(Model, GradientsMatchFiniteDifferencesForEveryTensor) {
  const ModelConfig c = Tiny();
  auto m = NewModel(c, 1);
  Perturb(*m, 2);
  const Batch b = MakeBatch(c, 2, 5, 3);
  m->ZeroGrad();
  Forward(*m, b);
  m->Backward();
  const std::vector<float> g(m->grads().begin(), m->grads().end());
  std::mt19937 rng(4);
  std::normal_distribution<float> normal;
  for (const TensorInfo& t : m->layout().Tensors()) {
    const std::string name = std::string(ParamKindName(t.kind)) + "[" +
                             std::to_string(t.layer) + "]";
    std::span<const float> gt(g.data() + t.range.begin, t.range.size());
    // Along a random direction: sum_i g_i d_i.
    std::vector<float> dir(t.range.size());
    double expect = 0, gnorm = 0;
    for (size_t i = 0; i < dir.size(); i++) {
      dir[i] = normal(rng);
      expect += static_cast<double>(gt[i]) * dir[i];
      gnorm += static_cast<double>(gt[i]) * gt[i];
    }
    const double fd = DirectionalFd(*m, b, t.range.begin, dir, 1e-3f);
    EXPECT_NEAR(fd, expect, 2e-3 * std::sqrt(gnorm) + 1e-4) << name;
    // Single elements.
    for (size_t i : Sample(gt, t.range.begin, rng)) {
      const double fdi = DirectionalFd(*m, b, i, {1.0f}, 1e-2f);
      EXPECT_NEAR(fdi, g[i], 1e-4 + 3e-3 * std::fabs(g[i]))
          << name << " element " << i - t.range.begin;
    }
  }
}

TEST(Model, PaddedVocabularyGetsZeroGradient) {
  auto m = NewModel(Tiny(), 1);
  Perturb(*m, 2);  // padding rows of wte non-zero too
  m->ZeroGrad();
  Forward(*m, MakeBatch(Tiny(), 2, 5, 3));
  m->Backward();
  const size_t C = 16;
  for (size_t i = 67 * C; i < 128 * C; i++) EXPECT_EQ(m->grads()[i], 0.0f);
  double real = 0;
  for (size_t i = 0; i < 67 * C; i++) real += std::fabs(m->grads()[i]);
  EXPECT_GT(real, 0.0);
}

TEST(Model, BackwardAccumulatesUntilZeroGrad) {
  auto m = NewModel(Tiny(), 1);
  Perturb(*m, 2);
  const Batch b = MakeBatch(Tiny(), 2, 5, 3);
  m->ZeroGrad();
  Forward(*m, b);
  m->Backward();
  const std::vector<float> once(m->grads().begin(), m->grads().end());
  Forward(*m, b);
  m->Backward();
  for (size_t i = 0; i < once.size(); i++) {
    ASSERT_NEAR(m->grads()[i], 2 * once[i], 1e-6 + 1e-5 * std::fabs(once[i]))
        << i;
  }
  m->ZeroGrad();
  Forward(*m, b);
  m->Backward(0.25f);  // loss_scale
  for (size_t i = 0; i < once.size(); i++) {
    ASSERT_NEAR(m->grads()[i], 0.25f * once[i],
                1e-7 + 1e-5 * std::fabs(once[i]))
        << i;
  }
}

// ZeRO-3 in miniature: the model's parameters are NaN except while a hook
// has supplied its layer, so any read outside a layer's window would poison
// the loss or the gradients.
TEST(Model, HooksCanSupplyEachLayerJustInTime) {
  const ModelConfig c = Tiny();
  const int L = c.num_layers;
  const Batch b = MakeBatch(c, 2, 5, 3);
  auto ref = NewModel(c, 1, ParamOrder::kLayerMajor);
  Perturb(*ref, 2);
  ref->ZeroGrad();
  const float ref_loss = Forward(*ref, b);
  ref->Backward();

  auto m = NewModel(c, 1, ParamOrder::kLayerMajor);
  const std::vector<float> master(ref->params().begin(), ref->params().end());
  std::fill(m->params().begin(), m->params().end(), NAN);
  const ParamLayout& lay = m->layout();
  auto set = [&](int layer, bool present) {
    for (int l : {layer, layer == L ? -1 : layer}) {  // the head reads wte
      for (const ParamRange& r : lay.LayerRanges(l)) {
        for (size_t i = r.begin; i < r.end; i++) {
          m->params()[i] = present ? master[i] : NAN;
        }
      }
    }
  };
  std::string trace;
  std::vector<std::vector<float>> final_at(L + 2);
  LayerHooks hooks;
  hooks.before_forward = [&](int l) {
    trace += "f" + std::to_string(l) + " ";
    set(l, true);
  };
  hooks.after_forward = [&](int l) { set(l, false); };
  hooks.before_backward = [&](int l) {
    trace += "b" + std::to_string(l) + " ";
    set(l, true);
  };
  hooks.after_backward = [&](int l) {
    set(l, false);
    for (const ParamRange& r : lay.LayerRanges(l)) {
      final_at[l + 1].insert(final_at[l + 1].end(),
                             m->grads().begin() + r.begin,
                             m->grads().begin() + r.end);
    }
  };
  m->set_hooks(hooks);
  m->ZeroGrad();
  EXPECT_EQ(Forward(*m, b), ref_loss);
  m->Backward();
  EXPECT_EQ(trace, "f-1 f0 f1 f2 b2 b1 b0 b-1 ");
  EXPECT_TRUE(
      std::equal(m->grads().begin(), m->grads().end(), ref->grads().begin()));
  // A layer's gradients are final at its after_backward (layer -1 here
  // includes dwte, which it completes).
  for (int l = -1; l <= L; l++) {
    const ParamRange r = lay.LayerRanges(l)[0];
    EXPECT_TRUE(std::equal(final_at[l + 1].begin(), final_at[l + 1].end(),
                           ref->grads().begin() + r.begin))
        << l;
  }
}

}  // namespace
}  // namespace dslaunch::worker
