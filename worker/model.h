// GPT-2 (llm.c's train_gpt2.c) on the CPU in fp32: forward and backward
// over a batch of tokens, with per-layer hooks and, for ZeRO-2/3, parameters
// and gradients supplied layer by layer through a ParamSource.
// A Model owns its activations and, unless given a ParamSource, its
// parameters and gradients. It is not thread-safe: one thread drives it; the
// kernels use OpenMP inside.
#pragma once

#include <cstddef>     // size_t
#include <cstdint>     // uint64_t
#include <functional>  // LayerHooks callbacks
#include <memory>      // unique_ptr
#include <span>        // parameter and gradient views
#include <string>      // file paths
#include <utility>     // move
#include <vector>      // buffers

#include "base/status.h"          // Status, StatusOr, DSL_CHECK
#include "worker/model_file.h"    // llm.c model files (kept for includers)
#include "worker/param_layout.h"  // ModelConfig, ParamLayout, InitParamRange

namespace dslaunch::worker {

// Callbacks around each hook layer, all optional: -1 is the embedding
// (wte, wpe), 0..L-1 the transformer blocks, L the head (lnfw, lnfb and the
// tied wte for the logits). Forward calls before_forward(l) / after_forward(l)
// for l = -1..L; Backward calls before_backward(l) / after_backward(l) for
// l = L..-1. A layer reads only its own parameters between its before_ and
// after_ calls, except that layer L also reads wte, so a hook may supply a
// layer's parameters just in time (ZeRO-3) and drop them afterwards.
// When after_backward(l) runs, the gradients of layer l's parameters are
// final for this pass, except dwte, which layer -1 completes.
// With a ParamSource the hooks are where its engine gathers and releases
// (see ParamSource for the exact windows).
struct LayerHooks {
  std::function<void(int layer)> before_forward;
  std::function<void(int layer)> after_forward;
  std::function<void(int layer)> before_backward;
  std::function<void(int layer)> after_backward;
};

// Supplies a Model's parameters and takes its gradients one hook layer at a
// time, so that a ZeRO engine need not hold whole parameters (stage 3) or
// whole gradients (stages 2 and 3). Layer l's memory is laid out as the
// flat kLayerMajor range layout.LayerRanges(l)[0]: float 0 of
// LayerParams(l) is the flat buffer's float LayerRanges(l)[0].begin.
// Called only by the thread driving the Model, between the hooks named
// below (the Model calls the hooks itself, as without a source):
//  LayerParams(l), l = 0..L: from before_forward(l) to after_forward(l) and
//    from before_backward(l) to after_backward(l).
//  LayerParams(-1) (wte, wpe): from before_forward(-1) to after_forward(-1),
//    and inside layer L's two windows, because the head's logits use the
//    tied wte: layer -1 must also be available from before_forward(L) to
//    after_forward(L) and from before_backward(L) to after_backward(L).
//    Layer -1's own backward reads no parameters.
//  LayerGrads(l), l = 0..L: from before_backward(l) to after_backward(l);
//    the gradients there are final for the pass at after_backward(l).
//  LayerGrads(-1) (dwte, dwpe): the head adds into dwte, so it is first
//    called inside layer L's backward window and last in layer -1's; its
//    memory must stay valid, keeping what was added, from before_backward(L)
//    to after_backward(-1), when dwte and dwpe are final.
// Repeated calls within one window must return the same memory; the Model
// keeps no pointer past a window. The Model only adds (+=) into gradient
// memory: what it holds beforehand is the source's choice (zeros for a
// fresh bucket, or earlier micro-batches' sum to accumulate).
class ParamSource {
 public:
  virtual ~ParamSource() = default;
  virtual float* LayerParams(int layer) = 0;
  virtual float* LayerGrads(int layer) = 0;
};

class Model {
 public:
  static StatusOr<std::unique_ptr<Model>> Create(
      const ModelConfig& config, ParamOrder order = ParamOrder::kLlmc);
  ~Model();
  Model(const Model&) = delete;
  Model& operator=(const Model&) = delete;

  const ModelConfig& config() const { return layout_.config(); }
  const ParamLayout& layout() const { return layout_; }
  std::span<float> params() { return params_; }
  std::span<const float> params() const { return params_; }
  std::span<float> grads() { return grads_; }
  std::span<const float> grads() const { return grads_; }

  // GPT-2 / llm.c initialisation of params() (see InitParamRange): the
  // same seed gives bit-identical parameters in either ParamOrder and for
  // any thread count. REQUIRES: no ParamSource.
  void InitParams(uint64_t seed);

  // Allocates the activations for batches of B x T tokens. Forward calls it;
  // a size already allocated costs nothing, and capacity is never returned.
  // REQUIRES: B >= 1, 1 <= T <= max_seq_len.
  void Resize(int B, int T);

  // tokens and targets are B*T ints (row-major (B, T)), each in [0, V);
  // targets may be null (inference: no loss). Returns the mean
  // cross-entropy loss over B*T, or -1 without targets. Afterwards probs()
  // holds the softmax over the real vocabulary (padding columns 0).
  float Forward(const int* tokens, const int* targets, int B, int T);
  // Adds the gradient of loss_scale * (mean loss) to grads() (or the
  // source's LayerGrads); call ZeroGrad first unless accumulating. Consumes
  // probs() (the buffer is reused for dlogits). REQUIRES: the last Forward
  // had targets and was not yet followed by a Backward.
  void Backward(float loss_scale = 1.0f);
  // Zeroes grads(); does nothing with a ParamSource, whose gradient memory
  // is its own to zero.
  void ZeroGrad();
  // Grows params() and grads() to `n` floats (zeros past num_params()), so
  // they split evenly across ranks for collectives. The layout is unchanged.
  // REQUIRES: no ParamSource.
  void PadFlatBuffers(size_t n);

  void set_hooks(LayerHooks hooks) { hooks_ = std::move(hooks); }
  // Hands parameter and gradient storage to `source` for good: from then on
  // Forward and Backward read parameters and add gradients only through it,
  // and the Model frees its own buffers, so params() and grads() are empty.
  // Initialise a shard with InitParamRange; WriteModelFile(path, Model)
  // needs the whole buffer, so write through the layout form instead.
  // `source` must outlive every later Forward and Backward.
  // REQUIRES: layout().order() == kLayerMajor, source not null, none set.
  void set_param_source(ParamSource* source);
  ParamSource* param_source() const { return source_; }

  int batch_size() const { return B_; }
  int seq_len() const { return T_; }
  std::span<const float> probs() const;   // (B, T, Vp), see Forward
  std::span<const float> losses() const;  // (B, T)
  size_t num_activation_floats() const { return acts_.size(); }

 private:
  struct Acts;
  Model(const ModelConfig& config, ParamOrder order);
  const float* BlockInput(int l) const;  // residual stream into block l
  void BlockForward(int l, const float* res_in);
  float HeadForward(const float* res_in);
  void HeadBackward(const float* res_in, float dloss);
  void BlockBackward(int l, const float* res_in);
  void CallHook(const std::function<void(int)>& hook, int layer);
  // Tensor (kind, layer) of the parameters (P) or gradients (G): in the
  // flat buffers, or with a source in its hook layer's memory.
  float* Locate(ParamKind kind, int layer, bool grad);
  float* P(ParamKind kind, int layer = 0);
  float* G(ParamKind kind, int layer = 0);

  ParamLayout layout_;
  std::vector<float> params_;  // empty with a source
  std::vector<float> grads_;   // empty with a source
  ParamSource* source_ = nullptr;
  // With a source: where each hook layer l starts in the flat buffer, at
  // [l + 1].
  std::vector<size_t> layer_begin_;
  std::vector<float> acts_;  // one allocation, carved by Acts
  std::unique_ptr<Acts> ptrs_;
  std::vector<int> tokens_, targets_;
  int B_ = 0, T_ = 0;
  bool backward_ready_ = false;
  LayerHooks hooks_;
};

// Model-level forms of worker/model_file.h's functions.
// REQUIRES: no ParamSource.
inline Status WriteModelFile(const std::string& path, const Model& model) {
  return WriteModelFile(path, model.layout(), model.params());
}
// A new model from a file.
StatusOr<std::unique_ptr<Model>> ReadModelFile(
    const std::string& path, ParamOrder order = ParamOrder::kLlmc);

}  // namespace dslaunch::worker
