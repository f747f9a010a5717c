#include "worker/param_layout.h"

#include <algorithm>  // sort, fill, min, max
#include <cmath>      // sqrt, log, cos, sin
#include <string>     // error messages

namespace dslaunch::worker {

// ---------------------------------------------------------------- config

ModelConfig ModelConfig::Make(int max_seq_len, int vocab_size, int num_layers,
                              int num_heads, int channels) {
  ModelConfig c;
  c.max_seq_len = max_seq_len;
  c.vocab_size = vocab_size;
  c.padded_vocab_size = (vocab_size + 63) / 64 * 64;
  c.num_layers = num_layers;
  c.num_heads = num_heads;
  c.channels = channels;
  return c;
}

StatusOr<ModelConfig> ModelConfig::Preset(std::string_view name) {
  struct Row {
    std::string_view name;
    int layers, heads, channels;
  };
  static constexpr Row kDepths[] = {
      {"d4", 4, 4, 256},     {"d6", 6, 6, 384},     {"d12", 12, 12, 768},
      {"d24", 24, 16, 1024}, {"d36", 36, 20, 1280}, {"d48", 48, 25, 1600}};
  for (const Row& r : kDepths) {
    if (r.name == name) return Make(1024, 50257, r.layers, r.heads, r.channels);
  }
  if (name == "tiny") return Make(8, 67, 2, 2, 16);
  return InvalidArgument("unknown model preset '" + std::string(name) +
                         "' (d4, d6, d12, d24, d36, d48, tiny)");
}

Status ModelConfig::Validate() const {
  if (max_seq_len <= 0 || vocab_size <= 0 || num_layers <= 0 ||
      num_heads <= 0 || channels <= 0) {
    return InvalidArgument("model sizes must be positive");
  }
  if (channels % num_heads != 0) {
    return InvalidArgument("channels (" + std::to_string(channels) +
                           ") must be a multiple of num_heads (" +
                           std::to_string(num_heads) + ")");
  }
  if (padded_vocab_size < vocab_size) {
    return InvalidArgument("padded_vocab_size is smaller than vocab_size");
  }
  return Status::Ok();
}

// ---------------------------------------------------------------- layout

const char* ParamKindName(ParamKind kind) {
  static constexpr const char* kNames[kNumParamKinds] = {
      "wte",      "wpe",      "ln1w", "ln1b", "qkvw", "qkvb",
      "attprojw", "attprojb", "ln2w", "ln2b", "fcw",  "fcb",
      "fcprojw",  "fcprojb",  "lnfw", "lnfb"};
  return kNames[static_cast<int>(kind)];
}

bool IsPerLayer(ParamKind kind) {
  return kind >= ParamKind::kLn1w && kind <= ParamKind::kFcprojb;
}

bool Decays(ParamKind kind) {
  switch (kind) {
    case ParamKind::kWte:
    case ParamKind::kWpe:
    case ParamKind::kQkvw:
    case ParamKind::kAttprojw:
    case ParamKind::kFcw:
    case ParamKind::kFcprojw:
      return true;
    default:
      return false;
  }
}

namespace {

ParamKind KindAt(int i) { return static_cast<ParamKind>(i); }

}  // namespace

ParamLayout::ParamLayout(const ModelConfig& config, ParamOrder order)
    : config_(config), order_(order) {
  DSL_CHECK(config.Validate().ok());
  const int L = config.num_layers;
  size_t off = 0;
  auto place = [&](ParamKind kind, int layer) {
    offsets_[static_cast<int>(kind)][layer] = off;
    off += Size(kind);
  };
  for (int k = 0; k < kNumParamKinds; k++) {
    offsets_[k].assign(IsPerLayer(KindAt(k)) ? L : 1, 0);
  }
  if (order == ParamOrder::kLlmc) {
    for (int k = 0; k < kNumParamKinds; k++) {
      for (size_t l = 0; l < offsets_[k].size(); l++) place(KindAt(k), l);
    }
  } else {
    place(ParamKind::kWte, 0);
    place(ParamKind::kWpe, 0);
    for (int l = 0; l < L; l++) {
      for (int k = 0; k < kNumParamKinds; k++) {
        if (IsPerLayer(KindAt(k))) place(KindAt(k), l);
      }
    }
    place(ParamKind::kLnfw, 0);
    place(ParamKind::kLnfb, 0);
  }
  num_params_ = off;
  decay_segments_ = MakeDecaySegments();
}

size_t ParamLayout::Size(ParamKind kind) const {
  const size_t C = config_.channels;
  switch (kind) {
    case ParamKind::kWte:
      return static_cast<size_t>(config_.padded_vocab_size) * C;
    case ParamKind::kWpe:
      return static_cast<size_t>(config_.max_seq_len) * C;
    case ParamKind::kQkvw:
      return 3 * C * C;
    case ParamKind::kQkvb:
      return 3 * C;
    case ParamKind::kAttprojw:
      return C * C;
    case ParamKind::kFcw:
    case ParamKind::kFcprojw:
      return 4 * C * C;
    case ParamKind::kFcb:
      return 4 * C;
    default:
      return C;  // LayerNorm weights and biases, attprojb, fcprojb
  }
}

size_t ParamLayout::Offset(ParamKind kind, int layer) const {
  const std::vector<size_t>& o = offsets_[static_cast<int>(kind)];
  if (o.size() == 1) return o[0];
  DSL_CHECK(layer >= 0 && layer < static_cast<int>(o.size()));
  return o[layer];
}

ParamRange ParamLayout::Range(ParamKind kind, int layer) const {
  const size_t begin = Offset(kind, layer);
  return ParamRange{begin, begin + Size(kind)};
}

int ParamLayout::HookLayer(ParamKind kind, int layer) const {
  if (IsPerLayer(kind)) return layer;
  return kind == ParamKind::kLnfw || kind == ParamKind::kLnfb
             ? config_.num_layers
             : -1;
}

std::vector<TensorInfo> ParamLayout::Tensors() const {
  std::vector<TensorInfo> out;
  for (int k = 0; k < kNumParamKinds; k++) {
    for (size_t l = 0; l < offsets_[k].size(); l++) {
      out.push_back(
          TensorInfo{KindAt(k), HookLayer(KindAt(k), l), Range(KindAt(k), l)});
    }
  }
  return out;
}

std::vector<ParamRange> ParamLayout::LayerRanges(int layer) const {
  std::vector<ParamRange> ranges;
  for (const TensorInfo& t : Tensors()) {
    if (t.layer == layer) ranges.push_back(t.range);
  }
  std::sort(ranges.begin(), ranges.end(),
            [](const ParamRange& a, const ParamRange& b) {
              return a.begin < b.begin;
            });
  std::vector<ParamRange> merged;
  for (const ParamRange& r : ranges) {
    if (!merged.empty() && merged.back().end == r.begin) {
      merged.back().end = r.end;
    } else {
      merged.push_back(r);
    }
  }
  return merged;
}

std::vector<DecaySegment> ParamLayout::MakeDecaySegments() const {
  std::vector<DecaySegment> segs;
  for (const TensorInfo& t : Tensors())
    segs.push_back({t.range, Decays(t.kind)});
  std::sort(segs.begin(), segs.end(),
            [](const DecaySegment& a, const DecaySegment& b) {
              return a.range.begin < b.range.begin;
            });
  std::vector<DecaySegment> merged;
  for (const DecaySegment& s : segs) {
    if (!merged.empty() && merged.back().decay == s.decay) {
      merged.back().range.end = s.range.end;
    } else {
      merged.push_back(s);
    }
  }
  return merged;
}

// ---------------------------------------------------------------- init

namespace {

// splitmix64's output function (Steele, Lea, Flood 2014). Output i of the
// stream with state `key` is Mix64(key + (i + 1) * kGamma): counter-based,
// so elements can be drawn in parallel in any order.
constexpr uint64_t kGamma = 0x9e3779b97f4a7c15ULL;
constexpr double kPi = 3.14159265358979323846;

uint64_t Mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

// Uniform in (0, 1] from the top 53 bits.
double ToUnit(uint64_t x) { return ((x >> 11) + 1) * 0x1.0p-53; }

// Elements [lo, hi) of the sequence std * N(0, 1) into x[0, hi - lo).
// Element i comes from Box-Muller pair j = i / 2, which uses stream outputs
// 2j and 2j+1 (cos for even i, sin for odd i).
void FillNormal(float* x, size_t lo, size_t hi, float std, uint64_t key) {
  if (lo >= hi) return;
#pragma omp parallel for schedule(static)
  for (size_t j = lo / 2; j < (hi + 1) / 2; j++) {
    const double u1 = ToUnit(Mix64(key + (2 * j + 1) * kGamma));
    const double u2 = ToUnit(Mix64(key + (2 * j + 2) * kGamma));
    const double r = std::sqrt(-2.0 * std::log(u1));
    const double theta = 2.0 * kPi * u2;
    if (2 * j >= lo)
      x[2 * j - lo] = static_cast<float>(std * r * std::cos(theta));
    if (2 * j + 1 < hi)
      x[2 * j + 1 - lo] = static_cast<float>(std * r * std::sin(theta));
  }
}

// Elements [lo, hi) of tensor instance t into x[0, hi - lo).
void InitTensorPart(const TensorInfo& t, const ModelConfig& c, uint64_t seed,
                    size_t lo, size_t hi, float* x) {
  const bool ln_weight = t.kind == ParamKind::kLn1w ||
                         t.kind == ParamKind::kLn2w ||
                         t.kind == ParamKind::kLnfw;
  std::fill(x, x + (hi - lo), ln_weight ? 1.0f : 0.0f);
  if (!Decays(t.kind)) return;  // below: the weight matrices and embeddings
  const bool residual =
      t.kind == ParamKind::kAttprojw || t.kind == ParamKind::kFcprojw;
  const float scale = residual ? 1.0f / std::sqrt(2.0f * c.num_layers) : 1.0f;
  // wte's padding rows stay 0.
  const size_t n = t.kind == ParamKind::kWte
                       ? static_cast<size_t>(c.vocab_size) * c.channels
                       : t.range.size();
  const uint64_t stream = static_cast<uint64_t>(t.kind) * 65536 + (t.layer + 1);
  FillNormal(x, lo, std::min(hi, n), 0.02f * scale,
             Mix64(seed + Mix64(stream + kGamma)));
}

}  // namespace

void InitParamRange(const ParamLayout& layout, uint64_t seed, ParamRange range,
                    std::span<float> out) {
  DSL_CHECK(range.begin <= range.end && range.end <= layout.num_params());
  DSL_CHECK(out.size() == range.size());
  for (const TensorInfo& t : layout.Tensors()) {
    const size_t begin = std::max(t.range.begin, range.begin);
    const size_t end = std::min(t.range.end, range.end);
    if (begin >= end) continue;
    InitTensorPart(t, layout.config(), seed, begin - t.range.begin,
                   end - t.range.begin, out.data() + (begin - range.begin));
  }
}

}  // namespace dslaunch::worker
