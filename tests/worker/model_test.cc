// The GPT-2 model of worker/model.h: configuration and layout, GPT-2
// initialisation, whole-model gradients against finite differences, gradient
// accumulation, per-layer hooks, and llm.c model file import/export.
#include "worker/model.h"

#include <gtest/gtest.h>
#include <unistd.h>  // getpid

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
#include <iterator>
#include <random>
#include <string>
#include <vector>

namespace dslaunch::worker {
namespace {

// The test model: V 67 (padded to 128), maxT 8, 2 layers, 2 heads, C 16.
ModelConfig Tiny() { return ModelConfig::Make(8, 67, 2, 2, 16); }

std::unique_ptr<Model> NewModel(const ModelConfig& c, uint64_t seed,
                                ParamOrder order = ParamOrder::kLlmc) {
  StatusOr<std::unique_ptr<Model>> m = Model::Create(c, order);
  EXPECT_TRUE(m.ok()) << m.status().ToString();
  (*m)->InitParams(seed);
  return std::move(m).value();
}

struct Batch {
  int B, T;
  std::vector<int> tokens, targets;
};

Batch MakeBatch(const ModelConfig& c, int B, int T, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> tok(0, c.vocab_size - 1);
  Batch b{B, T, std::vector<int>(B * T), std::vector<int>(B * T)};
  for (int& x : b.tokens) x = tok(rng);
  for (int& x : b.targets) x = tok(rng);
  return b;
}

float Forward(Model& m, const Batch& b) {
  return m.Forward(b.tokens.data(), b.targets.data(), b.B, b.T);
}

// Mean loss recomputed in double from the per-token losses (less rounding
// than the float return value, for finite differences).
double LossD(Model& m, const Batch& b) {
  Forward(m, b);
  double s = 0;
  for (float x : m.losses()) s += x;
  return s / m.losses().size();
}

// Moves every parameter off its init (LayerNorm weights off 1, biases off
// 0, larger weights) so the gradient check exercises every path.
void Perturb(Model& m, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> noise(0.0f, 0.3f);
  for (float& p : m.params()) p += noise(rng);
}

// Unique per process: other runs of this binary may share the directory.
std::string TempPath(const std::string& name) {
  return ::testing::TempDir() + "/dsl_model_test_" + std::to_string(getpid()) +
         "_" + name + ".bin";
}

std::vector<char> ReadBytes(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::vector<char>(std::istreambuf_iterator<char>(f), {});
}

void WriteBytes(const std::string& path, const std::vector<char>& bytes) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(bytes.data(), bytes.size());
}

TEST(ModelConfig, PresetsMatchGpt2AndPadVocab) {
  StatusOr<ModelConfig> d12 = ModelConfig::Preset("d12");
  ASSERT_TRUE(d12.ok());
  EXPECT_EQ(*d12, ModelConfig::Make(1024, 50257, 12, 12, 768));
  EXPECT_EQ(d12->padded_vocab_size, 50304);
  // llm.c prints num_parameters: 124475904 for GPT-2 124M (padded vocab).
  EXPECT_EQ(ParamLayout(*d12).num_params(), 124475904u);
  for (const char* name : {"d4", "d6", "d24", "d36", "d48", "tiny"}) {
    StatusOr<ModelConfig> c = ModelConfig::Preset(name);
    ASSERT_TRUE(c.ok()) << name;
    EXPECT_TRUE(c->Validate().ok()) << name;
    EXPECT_EQ(c->padded_vocab_size % 64, 0) << name;
  }
  EXPECT_EQ(ModelConfig::Preset("tiny")->padded_vocab_size, 128);
  EXPECT_EQ(ModelConfig::Preset("d7").status().code(),
            StatusCode::kInvalidArgument);
}

TEST(ModelConfig, RejectsHeadsNotDividingChannels) {
  const Status s = ModelConfig::Make(8, 67, 2, 3, 16).Validate();
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_FALSE(Model::Create(ModelConfig::Make(8, 67, 2, 3, 16)).ok());
}

TEST(ParamLayout, LlmcOrderAndShapes) {
  const ModelConfig c = Tiny();
  const ParamLayout lay(c);
  const size_t C = 16, L = 2, Vp = 128, T = 8;
  EXPECT_EQ(lay.Offset(ParamKind::kWte), 0u);
  EXPECT_EQ(lay.Offset(ParamKind::kWpe), Vp * C);
  EXPECT_EQ(lay.Offset(ParamKind::kLn1w, 1), (Vp + T) * C + C);
  EXPECT_EQ(lay.Offset(ParamKind::kQkvw, 0), (Vp + T) * C + 2 * L * C);
  EXPECT_EQ(lay.Size(ParamKind::kFcprojw), 4 * C * C);
  const size_t per_layer = 12 * C * C + 13 * C;
  EXPECT_EQ(lay.num_params(), (Vp + T) * C + L * per_layer + 2 * C);
  EXPECT_EQ(lay.Offset(ParamKind::kLnfb), lay.num_params() - C);
  EXPECT_EQ(lay.Tensors().size(), 4 + 12 * L);
}

// Every parameter belongs to exactly one hook layer.
void ExpectLayersPartition(const ParamLayout& lay) {
  std::vector<ParamRange> all;
  const int L = lay.config().num_layers;
  for (int l = -1; l <= L; l++) {
    for (const ParamRange& r : lay.LayerRanges(l)) all.push_back(r);
  }
  std::sort(all.begin(), all.end(),
            [](auto& a, auto& b) { return a.begin < b.begin; });
  size_t at = 0;
  for (const ParamRange& r : all) {
    EXPECT_EQ(r.begin, at);
    at = r.end;
  }
  EXPECT_EQ(at, lay.num_params());
}

TEST(ParamLayout, LayerMajorGivesOneRangePerLayer) {
  const ParamLayout lay(Tiny(), ParamOrder::kLayerMajor);
  size_t at = 0;
  for (int l = -1; l <= 2; l++) {
    const std::vector<ParamRange> r = lay.LayerRanges(l);
    ASSERT_EQ(r.size(), 1u) << l;
    EXPECT_EQ(r[0].begin, at);
    at = r[0].end;
  }
  EXPECT_EQ(at, lay.num_params());
  EXPECT_EQ(lay.num_params(), ParamLayout(Tiny()).num_params());
  const ParamLayout llmc(Tiny());
  EXPECT_EQ(llmc.LayerRanges(0).size(), 12u);
  EXPECT_EQ(llmc.LayerRanges(-1).size(), 1u);  // wte, wpe
  EXPECT_EQ(llmc.LayerRanges(2).size(), 1u);   // lnfw, lnfb
  ExpectLayersPartition(lay);
  ExpectLayersPartition(llmc);
}

TEST(ParamLayout, DecaySegmentsCoverWeightsOnly) {
  for (ParamOrder order : {ParamOrder::kLlmc, ParamOrder::kLayerMajor}) {
    const ParamLayout lay(Tiny(), order);
    size_t at = 0, decayed = 0;
    for (const DecaySegment& s : lay.DecaySegments()) {
      EXPECT_EQ(s.range.begin, at);
      at = s.range.end;
      if (s.decay) decayed += s.range.size();
    }
    EXPECT_EQ(at, lay.num_params());
    const size_t C = 16;
    EXPECT_EQ(decayed, (128 + 8) * C + 2 * (12 * C * C));
  }
  // wte+wpe | ln1 | qkvw | qkvb | attprojw | attprojb ln2 | fcw | fcb |
  // fcprojw | fcprojb lnf
  EXPECT_EQ(ParamLayout(Tiny()).DecaySegments().size(), 10u);
}

TEST(ModelInit, SameSeedSameBitsDifferentSeedDifferent) {
  auto a = NewModel(Tiny(), 7), b = NewModel(Tiny(), 7),
       c = NewModel(Tiny(), 8);
  EXPECT_TRUE(
      std::equal(a->params().begin(), a->params().end(), b->params().begin()));
  const ParamRange qkvw = a->layout().Range(ParamKind::kQkvw, 1);
  size_t differ = 0;
  for (size_t i = qkvw.begin; i < qkvw.end; i++) {
    differ += a->params()[i] != c->params()[i];
  }
  EXPECT_GT(differ, qkvw.size() * 99 / 100);
}

TEST(ModelInit, BothOrdersHoldTheSameTensors) {
  auto a = NewModel(Tiny(), 3),
       b = NewModel(Tiny(), 3, ParamOrder::kLayerMajor);
  for (const TensorInfo& t : a->layout().Tensors()) {
    const int l = IsPerLayer(t.kind) ? t.layer : 0;
    const ParamRange rb = b->layout().Range(t.kind, l);
    EXPECT_TRUE(std::equal(a->params().begin() + t.range.begin,
                           a->params().begin() + t.range.end,
                           b->params().begin() + rb.begin))
        << ParamKindName(t.kind) << " " << t.layer;
  }
}

double Std(std::span<const float> x) {
  double s = 0, s2 = 0;
  for (float v : x) s += v, s2 += static_cast<double>(v) * v;
  const double m = s / x.size();
  return std::sqrt(s2 / x.size() - m * m);
}

TEST(ModelInit, FollowsGpt2Scheme) {
  const ModelConfig c = ModelConfig::Make(16, 1000, 2, 4, 64);
  auto m = NewModel(c, 1);
  const ParamLayout& lay = m->layout();
  auto span = [&](ParamKind k, int l = 0) {
    const ParamRange r = lay.Range(k, l);
    return std::span<const float>(m->params().data() + r.begin, r.size());
  };
  EXPECT_NEAR(Std(span(ParamKind::kWte).first(1000 * 64)), 0.02, 0.001);
  EXPECT_NEAR(Std(span(ParamKind::kFcw, 1)), 0.02, 0.001);
  EXPECT_NEAR(Std(span(ParamKind::kFcprojw, 1)), 0.02 / 2,
              0.0005);  // 1/sqrt(2L)
  EXPECT_NEAR(Std(span(ParamKind::kAttprojw, 0)), 0.02 / 2, 0.0007);
  for (float x : span(ParamKind::kWte).subspan(1000 * 64)) EXPECT_EQ(x, 0.0f);
  for (ParamKind k : {ParamKind::kLn1w, ParamKind::kLn2w, ParamKind::kLnfw}) {
    for (float x : span(k, 1)) EXPECT_EQ(x, 1.0f);
  }
  for (ParamKind k : {ParamKind::kQkvb, ParamKind::kFcb, ParamKind::kLnfb,
                      ParamKind::kLn1b, ParamKind::kAttprojb}) {
    for (float x : span(k, 1)) EXPECT_EQ(x, 0.0f);
  }
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

TEST(ModelFile, ExportImportRoundTripIsBitExact) {
  auto m = NewModel(Tiny(), 5);
  Perturb(*m, 6);
  const std::string path = TempPath("roundtrip");
  ASSERT_TRUE(WriteModelFile(path, *m).ok());
  const std::vector<char> bytes = ReadBytes(path);
  EXPECT_EQ(bytes.size(), 1024 + 4 * m->layout().num_params());
  int32_t header[8];
  std::memcpy(header, bytes.data(), sizeof(header));
  EXPECT_EQ(std::vector<int32_t>(header, header + 8),
            (std::vector<int32_t>{20240326, 3, 8, 67, 2, 2, 16, 128}));

  StatusOr<std::unique_ptr<Model>> back = ReadModelFile(path);
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ((*back)->config(), m->config());
  EXPECT_EQ(std::memcmp((*back)->params().data(), m->params().data(),
                        m->params().size_bytes()),
            0);
  // Through the layer-major order and back: the same file.
  StatusOr<std::unique_ptr<Model>> lm =
      ReadModelFile(path, ParamOrder::kLayerMajor);
  ASSERT_TRUE(lm.ok());
  const std::string path2 = TempPath("roundtrip2");
  ASSERT_TRUE(WriteModelFile(path2, **lm).ok());
  EXPECT_EQ(ReadBytes(path2), bytes);
  std::remove(path.c_str());
  std::remove(path2.c_str());
}

// Writes a valid file, applies `edit` to its bytes, and returns the import
// error.
Status ImportEdited(const std::string& name,
                    const std::function<void(std::vector<char>&)>& edit) {
  auto m = NewModel(Tiny(), 5);
  const std::string path = TempPath(name);
  EXPECT_TRUE(WriteModelFile(path, *m).ok());
  std::vector<char> bytes = ReadBytes(path);
  edit(bytes);
  WriteBytes(path, bytes);
  StatusOr<std::unique_ptr<Model>> r = ReadModelFile(path);
  std::remove(path.c_str());
  EXPECT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find(path), std::string::npos)
      << r.status().ToString();
  return r.status();
}

TEST(ModelFile, ImportErrorsNameTheFile) {
  Status s = ImportEdited("magic", [](auto& b) { b[0] ^= 1; });
  EXPECT_EQ(s.code(), StatusCode::kDataError);
  EXPECT_NE(s.message().find("magic"), std::string::npos) << s.ToString();

  s = ImportEdited("version", [](auto& b) { b[4] = 5; });
  EXPECT_EQ(s.code(), StatusCode::kDataError);
  EXPECT_NE(s.message().find("version 5"), std::string::npos) << s.ToString();

  s = ImportEdited("truncated", [](auto& b) { b.resize(1024 + 4 * 1000 + 2); });
  EXPECT_EQ(s.code(), StatusCode::kDataError);
  EXPECT_NE(s.message().find("truncated"), std::string::npos) << s.ToString();

  s = ImportEdited("short_header", [](auto& b) { b.resize(100); });
  EXPECT_EQ(s.code(), StatusCode::kDataError);

  s = ImportEdited("trailing", [](auto& b) { b.push_back(0); });
  EXPECT_EQ(s.code(), StatusCode::kDataError);
  EXPECT_NE(s.message().find("trailing"), std::string::npos) << s.ToString();

  s = ImportEdited("bad_heads", [](auto& b) { b[20] = 3; });  // NH 3, C 16
  EXPECT_EQ(s.code(), StatusCode::kDataError);

  const std::string missing = TempPath("does_not_exist");
  StatusOr<std::unique_ptr<Model>> r = ReadModelFile(missing);
  EXPECT_EQ(r.status().code(), StatusCode::kNotFound);
  EXPECT_NE(r.status().message().find(missing), std::string::npos);
}

TEST(ModelFile, ParamsIntoAModelOfAnotherShapeAreRejected) {
  auto m = NewModel(Tiny(), 5);
  const std::string path = TempPath("shape");
  ASSERT_TRUE(WriteModelFile(path, *m).ok());
  auto other = NewModel(ModelConfig::Make(8, 67, 3, 2, 16), 5);
  const Status s = ReadModelFileParams(path, other->layout(), other->params());
  EXPECT_EQ(s.code(), StatusCode::kDataError);
  EXPECT_NE(s.message().find("L 2"), std::string::npos) << s.ToString();
  std::remove(path.c_str());
}

}  // namespace
}  // namespace dslaunch::worker
