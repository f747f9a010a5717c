// GPT-2 (llm.c's train_gpt2.c) on the CPU in fp32: configuration, the flat
// parameter layout, GPT-2 initialisation, forward and backward over a batch
// of tokens, and llm.c's model_*.bin import/export.
// A Model owns its parameters, gradients and activations. It is not
// thread-safe: one thread drives it; the kernels use OpenMP inside.
#pragma once

#include <cstddef>      // size_t
#include <cstdint>      // uint64_t
#include <functional>   // LayerHooks callbacks
#include <memory>       // unique_ptr
#include <span>         // parameter and gradient views
#include <string>       // file paths
#include <string_view>  // preset names
#include <vector>       // buffers, range lists

#include "proto/status.h"  // Status, StatusOr, DSL_CHECK

namespace dslaunch::worker {

struct ModelConfig {
  int max_seq_len = 0;        // maxT
  int vocab_size = 0;         // V
  int padded_vocab_size = 0;  // Vp: V rounded up to a multiple of 64
  int num_layers = 0;         // L
  int num_heads = 0;          // NH
  int channels = 0;           // C

  // padded_vocab_size is derived from vocab_size.
  static ModelConfig Make(int max_seq_len, int vocab_size, int num_layers,
                          int num_heads, int channels);
  // llm.c's depth presets with GPT-2's tokenizer (maxT 1024, V 50257):
  // "d12" (GPT-2 124M: 12 layers, 12 heads, 768), "d24" (350M), "d36",
  // "d48"; smaller "d6" (6, 6, 384) and "d4" (4, 4, 256); and "tiny"
  // (maxT 8, V 67, 2 layers, 2 heads, 16 channels) for tests.
  static StatusOr<ModelConfig> Preset(std::string_view name);
  // InvalidArgument unless every size is positive, C % NH == 0 and
  // V <= Vp.
  Status Validate() const;
  bool operator==(const ModelConfig&) const = default;
};

// The 16 parameter tensors, in llm.c's order. The 12 from kLn1w to kFcprojb
// exist once per transformer block.
enum class ParamKind {
  kWte,       // (Vp, C) token embedding, tied with the output projection
  kWpe,       // (maxT, C) position embedding
  kLn1w,      // (L, C)
  kLn1b,      // (L, C)
  kQkvw,      // (L, 3C, C)
  kQkvb,      // (L, 3C)
  kAttprojw,  // (L, C, C)
  kAttprojb,  // (L, C)
  kLn2w,      // (L, C)
  kLn2b,      // (L, C)
  kFcw,       // (L, 4C, C)
  kFcb,       // (L, 4C)
  kFcprojw,   // (L, C, 4C)
  kFcprojb,   // (L, C)
  kLnfw,      // (C)
  kLnfb,      // (C)
};
inline constexpr int kNumParamKinds = 16;

const char* ParamKindName(ParamKind kind);  // "wte", "qkvw", ...
bool IsPerLayer(ParamKind kind);            // kLn1w .. kFcprojb
// Weight decay applies to wte, wpe and the four weight matrices of a block;
// not to biases or LayerNorm parameters.
bool Decays(ParamKind kind);

// Storage order of the flat buffer.
//  kLlmc: llm.c's, tensor-major (all layers' ln1w, then all qkvw, ...): the
//    model file's body verbatim.
//  kLayerMajor: wte, wpe, then block 0's 12 tensors, block 1's, ..., lnfw,
//    lnfb: every layer's parameters are one contiguous range (ZeRO-3 gathers
//    one layer at a time).
// Files are always written in llm.c's order; both orders hold identical
// tensors.
enum class ParamOrder { kLlmc, kLayerMajor };

struct ParamRange {
  size_t begin = 0, end = 0;  // [begin, end) in floats
  size_t size() const { return end - begin; }
  bool operator==(const ParamRange&) const = default;
};

// One instance of a tensor: `layer` is the block for per-layer kinds, -1 for
// wte and wpe, L for lnfw and lnfb (the hook layer numbering below).
struct TensorInfo {
  ParamKind kind;
  int layer;
  ParamRange range;
};

// A run of the flat buffer with one weight-decay flag (for AdamStep).
struct DecaySegment {
  ParamRange range;
  bool decay;
};

// Where each tensor sits in the flat parameter (and gradient) buffer.
// Immutable value; any thread.
class ParamLayout {
 public:
  explicit ParamLayout(const ModelConfig& config,
                       ParamOrder order = ParamOrder::kLlmc);

  const ModelConfig& config() const { return config_; }
  ParamOrder order() const { return order_; }
  size_t num_params() const { return num_params_; }
  // Floats in one instance of `kind` (one layer's share for per-layer kinds).
  size_t Size(ParamKind kind) const;
  // The instance of `kind` in block `layer`; `layer` is ignored for wte,
  // wpe, lnfw, lnfb.
  size_t Offset(ParamKind kind, int layer = 0) const;
  ParamRange Range(ParamKind kind, int layer = 0) const;
  // Every tensor instance in llm.c's file order (kind-major).
  std::vector<TensorInfo> Tensors() const;
  // The parameters owned by hook layer `layer` (-1: wte, wpe; 0..L-1: a
  // block; L: lnfw, lnfb), ascending, adjacent ranges merged: exactly one
  // range in kLayerMajor order, 12 per block in kLlmc order.
  std::vector<ParamRange> LayerRanges(int layer) const;
  // Covers [0, num_params()) in order, adjacent runs with the same flag
  // merged.
  std::vector<DecaySegment> DecaySegments() const;

 private:
  ModelConfig config_;
  ParamOrder order_;
  size_t num_params_ = 0;
  std::vector<size_t> offsets_[kNumParamKinds];  // per instance
};

// Callbacks around each hook layer, all optional: -1 is the embedding
// (wte, wpe), 0..L-1 the transformer blocks, L the head (lnfw, lnfb and the
// tied wte for the logits). Forward calls before_forward(l) / after_forward(l)
// for l = -1..L; Backward calls before_backward(l) / after_backward(l) for
// l = L..-1. A layer reads only its own parameters between its before_ and
// after_ calls, except that layer L also reads wte, so a hook may supply a
// layer's parameters just in time (ZeRO-3) and drop them afterwards.
// When after_backward(l) runs, the gradients of layer l's parameters are
// final for this pass, except dwte, which layer -1 completes.
struct LayerHooks {
  std::function<void(int layer)> before_forward;
  std::function<void(int layer)> after_forward;
  std::function<void(int layer)> before_backward;
  std::function<void(int layer)> after_backward;
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

  // GPT-2 / llm.c initialisation: wte, wpe and the block weight matrices
  // ~ N(0, 0.02), attprojw and fcprojw scaled by 1/sqrt(2L); LayerNorm
  // weights 1; biases and wte's padding rows 0. Each tensor instance draws
  // from its own counter-based stream (splitmix64 + Box-Muller) keyed by
  // (seed, kind, layer): the same seed gives bit-identical parameters in
  // either ParamOrder and for any thread count.
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
  // Adds the gradient of loss_scale * (mean loss) to grads(); call ZeroGrad
  // first unless accumulating. Consumes probs() (the buffer is reused for
  // dlogits). REQUIRES: the last Forward had targets and was not yet
  // followed by a Backward.
  void Backward(float loss_scale = 1.0f);
  void ZeroGrad();
  // Grows params() and grads() to `n` floats (zeros past num_params()), so
  // they split evenly across ranks for collectives. The layout is unchanged.
  void PadFlatBuffers(size_t n);

  void set_hooks(LayerHooks hooks) { hooks_ = std::move(hooks); }

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
  float* P(ParamKind kind, int layer = 0);
  float* G(ParamKind kind, int layer = 0);

  ParamLayout layout_;
  std::vector<float> params_;
  std::vector<float> grads_;
  std::vector<float> acts_;  // one allocation, carved by Acts
  std::unique_ptr<Acts> ptrs_;
  std::vector<int> tokens_, targets_;
  int B_ = 0, T_ = 0;
  bool backward_ready_ = false;
  LayerHooks hooks_;
};

// llm.c's model file: int32 header[256] = {20240326, 3 (fp32), maxT, V, L,
// NH, C, Vp, 0...}, then every tensor in llm.c's order as fp32.
inline constexpr int kModelFileMagic = 20240326;
inline constexpr int kModelFileVersionFp32 = 3;

// Writes `params` (laid out by `layout`) to path, through path + ".tmp" and
// a rename.
Status WriteModelFile(const std::string& path, const ParamLayout& layout,
                      std::span<const float> params);
inline Status WriteModelFile(const std::string& path, const Model& model) {
  return WriteModelFile(path, model.layout(), model.params());
}
// The header's config. DataError naming the file on a short header, wrong
// magic or version, or an invalid config.
StatusOr<ModelConfig> ReadModelFileConfig(const std::string& path);
// Header and parameters into `params` (laid out by `layout`, whose config
// must match the file's). DataError naming the file if truncated or longer
// than expected.
Status ReadModelFileParams(const std::string& path, const ParamLayout& layout,
                           std::span<float> params);
// A new model from a file.
StatusOr<std::unique_ptr<Model>> ReadModelFile(
    const std::string& path, ParamOrder order = ParamOrder::kLlmc);

}  // namespace dslaunch::worker
