// worker/param_layout.h: GPT-2 configurations, the flat parameter layout in
// both orders, and GPT-2 initialisation (whole buffer and shards).
#include "worker/param_layout.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <span>
#include <vector>

#include "tests/worker/model_test_util.h"

namespace dslaunch::worker {
namespace {

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

// A ZeRO-3 rank initialises only its shard: any cut of the buffer, at odd
// offsets inside tensors and Box-Muller pairs, matches the whole init.
TEST(InitParamRange, ShardsMatchTheWholeBufferBitForBit) {
  for (ParamOrder order : {ParamOrder::kLlmc, ParamOrder::kLayerMajor}) {
    auto m = NewModel(Tiny(), 9, order);
    const size_t n = m->layout().num_params();
    const std::vector<size_t> cuts = {0,    0,         1,     7,     2048,
                                      2049, n / 3 + 1, n - 5, n - 4, n};
    std::vector<float> joined;
    for (size_t i = 0; i + 1 < cuts.size(); i++) {
      std::vector<float> part(cuts[i + 1] - cuts[i], -1.0f);
      InitParamRange(m->layout(), 9, ParamRange{cuts[i], cuts[i + 1]}, part);
      joined.insert(joined.end(), part.begin(), part.end());
    }
    ASSERT_EQ(joined.size(), n);
    EXPECT_EQ(std::memcmp(joined.data(), m->params().data(), n * 4), 0);
  }
}

}  // namespace
}  // namespace dslaunch::worker
