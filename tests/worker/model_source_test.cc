// Model::set_param_source: a Model whose parameters and gradients live in a
// ParamSource, one hook layer at a time, gives bit-for-bit the results of a
// Model owning whole buffers, and reads and writes each layer only inside the
// windows of ParamSource's contract.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "tests/worker/model_test_util.h"
#include "worker/model.h"

namespace dslaunch::worker {
namespace {

// Holds each hook layer's parameters and gradients in vectors of its own, as
// a ZeRO-3 engine would after gathering them. The hooks from Hooks() open and
// close each layer's windows as ParamSource's contract says; a buffer is
// allocated at the first request inside its window, and on closing it is
// filled with NaN and kept (not freed), so a read through a stale pointer
// poisons the results and a write through one is lost. Between windows a
// layer lives only in flat kLayerMajor vectors (standing in for shards):
// parameters are copied in on allocation, gradients in on allocation and
// back on closing. A request outside a window counts as a violation.
class LayerBuffers : public ParamSource {
 public:
  // `keep_wte_for_head` false breaks the contract on purpose: layer -1 is
  // not opened for the head.
  LayerBuffers(const ParamLayout& layout, std::vector<float> params,
               bool keep_wte_for_head = true)
      : layout_(layout),
        keep_wte_for_head_(keep_wte_for_head),
        params_(std::move(params)),
        grads_(params_.size(), 0.0f),
        param_windows_(layout.config().num_layers + 2),
        grad_windows_(layout.config().num_layers + 2) {}

  float* LayerParams(int layer) override {
    return Request(param_windows_, params_, layer, "LayerParams");
  }
  float* LayerGrads(int layer) override {
    return Request(grad_windows_, grads_, layer, "LayerGrads");
  }

  LayerHooks Hooks() {
    const int L = layout_.config().num_layers;
    const bool wte = keep_wte_for_head_;
    LayerHooks h;
    h.before_forward = [this, L, wte](int l) {
      Open(param_windows_, l);
      if (l == L && wte) Open(param_windows_, -1);
    };
    h.after_forward = [this, L, wte](int l) {
      Close(param_windows_, l, nullptr);
      if (l == L && wte) Close(param_windows_, -1, nullptr);
    };
    h.before_backward = [this, L, wte](int l) {
      if (l != -1) Open(param_windows_, l);  // layer -1 reads no parameters
      Open(grad_windows_, l);
      if (l == L && wte) Open(param_windows_, -1);
      if (l == L) Open(grad_windows_, -1);  // dwte, until after_backward(-1)
    };
    h.after_backward = [this, L, wte](int l) {
      if (l != -1) Close(param_windows_, l, nullptr);
      if (l == L && wte) Close(param_windows_, -1, nullptr);
      Close(grad_windows_, l, &grads_);  // -1 stays open until l == -1
    };
    return h;
  }

  std::vector<float>& params() { return params_; }
  std::vector<float>& grads() { return grads_; }
  const std::string& violations() const { return violations_; }
  bool AllClosed() const {
    for (const Window& w : param_windows_) {
      if (w.open) return false;
    }
    for (const Window& w : grad_windows_) {
      if (w.open) return false;
    }
    return true;
  }

 private:
  struct Window {
    bool open = false;
    std::vector<float> buffer;  // empty until requested
  };

  ParamRange RangeOf(int layer) const { return layout_.LayerRanges(layer)[0]; }

  void Open(std::vector<Window>& windows, int layer) {
    windows[layer + 1].open = true;
  }

  // Copies the buffer back to `flat` when given, then poisons and retires it.
  void Close(std::vector<Window>& windows, int layer,
             std::vector<float>* flat) {
    Window& w = windows[layer + 1];
    if (!w.buffer.empty()) {
      if (flat != nullptr) {
        std::copy(w.buffer.begin(), w.buffer.end(),
                  flat->begin() + RangeOf(layer).begin);
      }
      std::fill(w.buffer.begin(), w.buffer.end(), NAN);
      retired_.push_back(std::move(w.buffer));
      w.buffer.clear();
    }
    w.open = false;
  }

  float* Request(std::vector<Window>& windows, const std::vector<float>& flat,
                 int layer, const char* what) {
    const ParamRange r = RangeOf(layer);
    Window& w = windows[layer + 1];
    if (!w.open) {
      violations_ += std::string(what) + "(" + std::to_string(layer) + ") ";
      retired_.emplace_back(r.size(), NAN);
      return retired_.back().data();
    }
    if (w.buffer.empty()) {
      w.buffer.assign(flat.begin() + r.begin, flat.begin() + r.end);
    }
    return w.buffer.data();
  }

  const ParamLayout& layout_;
  const bool keep_wte_for_head_;
  std::vector<float> params_, grads_;                 // flat, kLayerMajor
  std::vector<Window> param_windows_, grad_windows_;  // layer l at [l + 1]
  std::vector<std::vector<float>> retired_;
  std::string violations_;
};

// memcmp, so that NaN never equals anything; names the first difference.
void ExpectBitEqual(std::span<const float> got, std::span<const float> want,
                    const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  if (std::memcmp(got.data(), want.data(), got.size_bytes()) == 0) return;
  for (size_t i = 0; i < got.size(); i++) {
    if (std::memcmp(&got[i], &want[i], sizeof(float)) != 0) {
      ADD_FAILURE() << what << " differ first at " << i << ": " << got[i]
                    << " vs " << want[i];
      return;
    }
  }
}

struct Pair {
  std::unique_ptr<Model> full;    // owns whole buffers
  std::unique_ptr<Model> shared;  // through `source`
  std::unique_ptr<LayerBuffers> source;
};

// Two models with the same (perturbed) parameters.
Pair MakePair(bool keep_wte_for_head = true) {
  Pair p;
  p.full = NewModel(Tiny(), 1, ParamOrder::kLayerMajor);
  Perturb(*p.full, 2);
  p.shared = NewModel(Tiny(), 1, ParamOrder::kLayerMajor);
  p.source = std::make_unique<LayerBuffers>(
      p.shared->layout(),
      std::vector<float>(p.full->params().begin(), p.full->params().end()),
      keep_wte_for_head);
  p.shared->set_hooks(p.source->Hooks());
  p.shared->set_param_source(p.source.get());
  return p;
}

// `steps` SGD steps of `micro` accumulated micro-batches each, on both
// models, comparing every loss and the gradients of every step.
void ExpectSameTraining(int steps, int micro) {
  Pair p = MakePair();
  EXPECT_TRUE(p.shared->params().empty());
  EXPECT_TRUE(p.shared->grads().empty());
  EXPECT_EQ(p.shared->param_source(), p.source.get());
  std::vector<float>& params = p.source->params();
  std::vector<float>& grads = p.source->grads();
  for (int step = 0; step < steps; step++) {
    p.full->ZeroGrad();
    std::fill(grads.begin(), grads.end(), 0.0f);  // the source's ZeroGrad
    for (int k = 0; k < micro; k++) {
      const Batch b = MakeBatch(Tiny(), 2, 5, 10 * step + k);
      EXPECT_EQ(Forward(*p.shared, b), Forward(*p.full, b));
      p.full->Backward(1.0f / micro);
      p.shared->Backward(1.0f / micro);
    }
    const std::string at = "step " + std::to_string(step);
    ExpectBitEqual(grads, p.full->grads(), "gradients at " + at);
    for (size_t i = 0; i < params.size(); i++) {
      p.full->params()[i] -= 0.1f * p.full->grads()[i];
      params[i] -= 0.1f * grads[i];
    }
  }
  ExpectBitEqual(params, p.full->params(), "parameters");
  EXPECT_EQ(p.source->violations(), "");
  EXPECT_TRUE(p.source->AllClosed());
}

TEST(ModelParamSource, TwoStepsMatchTheFullBufferModelBitForBit) {
  ExpectSameTraining(2, 1);
}

TEST(ModelParamSource, AccumulatingTwoBackwardsMatchesBitForBit) {
  ExpectSameTraining(2, 2);
}

TEST(ModelParamSource, InferenceMatchesBitForBit) {
  Pair p = MakePair();
  const Batch b = MakeBatch(Tiny(), 2, 5, 3);
  EXPECT_EQ(p.shared->Forward(b.tokens.data(), nullptr, 2, 5), -1.0f);
  p.full->Forward(b.tokens.data(), nullptr, 2, 5);
  ExpectBitEqual(p.shared->probs(), p.full->probs(), "probabilities");
  EXPECT_EQ(p.source->violations(), "");
}

// The harness catches a source that drops wte before the head: the head's
// request is outside a window and the loss turns NaN.
TEST(ModelParamSource, HeadReadsWteInsideItsOwnWindow) {
  Pair p = MakePair(/*keep_wte_for_head=*/false);
  const float loss = Forward(*p.shared, MakeBatch(Tiny(), 2, 5, 3));
  EXPECT_TRUE(std::isnan(loss));
  EXPECT_EQ(p.source->violations(), "LayerParams(-1) ");
}

TEST(ModelParamSource, ZeroGradLeavesTheSourceAlone) {
  Pair p = MakePair();
  std::fill(p.source->grads().begin(), p.source->grads().end(), 1.0f);
  p.shared->ZeroGrad();
  for (float g : p.source->grads()) ASSERT_EQ(g, 1.0f);
}

TEST(ModelParamSourceDeathTest, RequiresLayerMajorOrder) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  auto m = NewModel(Tiny(), 1, ParamOrder::kLlmc);
  LayerBuffers source(
      m->layout(), std::vector<float>(m->params().begin(), m->params().end()));
  EXPECT_DEATH(m->set_param_source(&source), "kLayerMajor");
}

}  // namespace
}  // namespace dslaunch::worker
