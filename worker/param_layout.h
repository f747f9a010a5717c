// GPT-2's configuration, the flat parameter layout (which tensor sits where
// in the one float buffer of parameters, and the same for gradients) in
// llm.c's order or layer-major, and GPT-2's initial parameter values for any
// range of that buffer. Immutable values and pure functions: any thread.
#pragma once

#include <cstddef>      // size_t
#include <cstdint>      // uint64_t
#include <span>         // InitParamRange's output
#include <string_view>  // preset names
#include <vector>       // range lists

#include "base/status.h"  // Status, StatusOr

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
// wte and wpe, L for lnfw and lnfb (the hook layer numbering of model.h).
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
  // The hook layer owning that instance: -1 for wte and wpe, `layer` for
  // per-layer kinds, L for lnfw and lnfb.
  int HookLayer(ParamKind kind, int layer = 0) const;
  // Every tensor instance in llm.c's file order (kind-major).
  std::vector<TensorInfo> Tensors() const;
  // The parameters owned by hook layer `layer` (-1: wte, wpe; 0..L-1: a
  // block; L: lnfw, lnfb), ascending, adjacent ranges merged: exactly one
  // range in kLayerMajor order, 12 per block in kLlmc order.
  std::vector<ParamRange> LayerRanges(int layer) const;
  // Covers [0, num_params()) in order, adjacent runs with the same flag
  // merged. Made once (the optimizer step walks it every step).
  const std::vector<DecaySegment>& DecaySegments() const {
    return decay_segments_;
  }

 private:
  std::vector<DecaySegment> MakeDecaySegments() const;

  ModelConfig config_;
  ParamOrder order_;
  size_t num_params_ = 0;
  std::vector<size_t> offsets_[kNumParamKinds];  // per instance
  std::vector<DecaySegment> decay_segments_;
};

// GPT-2 / llm.c initialisation of the flat buffer's floats [range.begin,
// range.end), written to out[0, range.size()): wte, wpe and the block weight
// matrices ~ N(0, 0.02), attprojw and fcprojw scaled by 1/sqrt(2L);
// LayerNorm weights 1; biases and wte's padding rows 0. Each tensor instance
// draws from its own counter-based stream (splitmix64 + Box-Muller) keyed by
// (seed, kind, layer), so any range (a ZeRO-3 shard) gets bit-for-bit the
// values of the whole buffer's init, in either ParamOrder and for any thread
// count. REQUIRES: range.end <= layout.num_params(), out.size() ==
// range.size().
void InitParamRange(const ParamLayout& layout, uint64_t seed, ParamRange range,
                    std::span<float> out);

}  // namespace dslaunch::worker
