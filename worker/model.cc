#include "worker/model.h"

#include <cblas.h>  // cblas_sgemm for the logits over the real vocabulary

#include <algorithm>  // sort, fill
#include <cerrno>     // errno, ENOENT
#include <cmath>      // sqrt, log, cos, sin
#include <cstdio>     // FILE, fopen, fread, fwrite, rename
#include <cstring>    // memset, strerror

#include "worker/kernels_cpu.h"

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

// The hook layer owning an instance: -1 embedding, l block, L head.
int OwnerLayer(ParamKind kind, int layer, int L) {
  if (IsPerLayer(kind)) return layer;
  return kind == ParamKind::kLnfw || kind == ParamKind::kLnfb ? L : -1;
}

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

std::vector<TensorInfo> ParamLayout::Tensors() const {
  std::vector<TensorInfo> out;
  for (int k = 0; k < kNumParamKinds; k++) {
    for (size_t l = 0; l < offsets_[k].size(); l++) {
      const int layer = OwnerLayer(KindAt(k), l, config_.num_layers);
      out.push_back(TensorInfo{KindAt(k), layer, Range(KindAt(k), l)});
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

std::vector<DecaySegment> ParamLayout::DecaySegments() const {
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

// x[i] = std * N(0, 1) for i < n; pair j of Box-Muller uses stream outputs
// 2j and 2j+1 and fills x[2j], x[2j+1].
void FillNormal(float* x, size_t n, float std, uint64_t key) {
  const size_t pairs = (n + 1) / 2;
#pragma omp parallel for schedule(static)
  for (size_t j = 0; j < pairs; j++) {
    const double u1 = ToUnit(Mix64(key + (2 * j + 1) * kGamma));
    const double u2 = ToUnit(Mix64(key + (2 * j + 2) * kGamma));
    const double r = std::sqrt(-2.0 * std::log(u1));
    const double theta = 2.0 * kPi * u2;
    x[2 * j] = static_cast<float>(std * r * std::cos(theta));
    if (2 * j + 1 < n)
      x[2 * j + 1] = static_cast<float>(std * r * std::sin(theta));
  }
}

}  // namespace

void Model::InitParams(uint64_t seed) {
  const ModelConfig& c = config();
  const float residual_scale = 1.0f / std::sqrt(2.0f * c.num_layers);
  std::fill(params_.begin(), params_.end(), 0.0f);
  for (const TensorInfo& t : layout_.Tensors()) {
    float* x = params_.data() + t.range.begin;
    if (t.kind == ParamKind::kLn1w || t.kind == ParamKind::kLn2w ||
        t.kind == ParamKind::kLnfw) {
      std::fill(x, x + t.range.size(), 1.0f);
    } else if (Decays(t.kind)) {  // the weight matrices and embeddings
      const bool residual =
          t.kind == ParamKind::kAttprojw || t.kind == ParamKind::kFcprojw;
      // wte's padding rows stay 0.
      const size_t n = t.kind == ParamKind::kWte
                           ? static_cast<size_t>(c.vocab_size) * c.channels
                           : t.range.size();
      const uint64_t stream =
          static_cast<uint64_t>(t.kind) * 65536 + (t.layer + 1);
      FillNormal(x, n, 0.02f * (residual ? residual_scale : 1.0f),
                 Mix64(seed + Mix64(stream + kGamma)));
    }
  }
}

// ---------------------------------------------------------------- model

namespace {

// Hands out consecutive pieces of one buffer; with a null base it only
// counts.
class Carver {
 public:
  explicit Carver(float* base) : base_(base) {}
  float* Take(size_t n) {
    float* p = base_ != nullptr ? base_ + used_ : nullptr;
    used_ += n;
    return p;
  }
  size_t used() const { return used_; }

 private:
  float* base_;
  size_t used_ = 0;
};

void Zero(float* p, size_t n) { std::memset(p, 0, n * sizeof(float)); }

}  // namespace

// Pointers into Model::acts_ for the current (B, T), reassigned by Resize.
struct Model::Acts {
  struct Layer {  // saved by the forward pass for the backward pass
    float *ln1, *ln1_mean, *ln1_rstd, *qkv, *atty, *lse, *res2, *ln2, *ln2_mean,
        *ln2_rstd, *fch, *res3;
  };
  std::vector<Layer> layers;
  float *encoded, *lnf, *lnf_mean, *lnf_rstd, *logits, *losses;
  float *scratch, *scratch4;       // (B,T,C), (B,T,4C): not saved
  float *dres, *dbtc, *dqkv, *d4;  // activation gradients, reused per layer

  // Carves every buffer for B x T out of base (null: only counts); returns
  // the floats needed.
  size_t Assign(float* base, const ModelConfig& c, int B, int T) {
    Carver cv(base);
    const size_t BT = static_cast<size_t>(B) * T, C = c.channels;
    layers.resize(c.num_layers);
    encoded = cv.Take(BT * C);
    for (Layer& y : layers) {
      y.ln1 = cv.Take(BT * C);
      y.ln1_mean = cv.Take(BT);
      y.ln1_rstd = cv.Take(BT);
      y.qkv = cv.Take(3 * BT * C);
      y.atty = cv.Take(BT * C);
      y.lse = cv.Take(BT * c.num_heads);
      y.res2 = cv.Take(BT * C);
      y.ln2 = cv.Take(BT * C);
      y.ln2_mean = cv.Take(BT);
      y.ln2_rstd = cv.Take(BT);
      y.fch = cv.Take(4 * BT * C);
      y.res3 = cv.Take(BT * C);
    }
    lnf = cv.Take(BT * C);
    lnf_mean = cv.Take(BT);
    lnf_rstd = cv.Take(BT);
    logits = cv.Take(BT * c.padded_vocab_size);
    losses = cv.Take(BT);
    scratch = cv.Take(BT * C);
    scratch4 = cv.Take(4 * BT * C);
    dres = cv.Take(BT * C);
    dbtc = cv.Take(BT * C);
    dqkv = cv.Take(3 * BT * C);
    d4 = cv.Take(4 * BT * C);
    return cv.used();
  }
};

using K = ParamKind;

Model::Model(const ModelConfig& config, ParamOrder order)
    : layout_(config, order),
      params_(layout_.num_params()),
      grads_(layout_.num_params()),
      ptrs_(std::make_unique<Acts>()) {}

Model::~Model() = default;

StatusOr<std::unique_ptr<Model>> Model::Create(const ModelConfig& config,
                                               ParamOrder order) {
  RETURN_IF_ERROR(config.Validate());
  return std::unique_ptr<Model>(new Model(config, order));
}

void Model::Resize(int B, int T) {
  DSL_CHECK(B >= 1 && T >= 1 && T <= config().max_seq_len);
  if (B == B_ && T == T_) return;
  const size_t n = ptrs_->Assign(nullptr, config(), B, T);
  if (acts_.size() < n) acts_.resize(n);
  ptrs_->Assign(acts_.data(), config(), B, T);
  B_ = B;
  T_ = T;
  backward_ready_ = false;
}

float* Model::P(ParamKind kind, int layer) {
  return params_.data() + layout_.Offset(kind, layer);
}

float* Model::G(ParamKind kind, int layer) {
  return grads_.data() + layout_.Offset(kind, layer);
}

void Model::CallHook(const std::function<void(int)>& hook, int layer) {
  if (hook) hook(layer);
}

const float* Model::BlockInput(int l) const {
  return l == 0 ? ptrs_->encoded : ptrs_->layers[l - 1].res3;
}

std::span<const float> Model::probs() const {
  return {ptrs_->logits,
          static_cast<size_t>(B_) * T_ * config().padded_vocab_size};
}

std::span<const float> Model::losses() const {
  return {ptrs_->losses, static_cast<size_t>(B_) * T_};
}

void Model::ZeroGrad() { std::fill(grads_.begin(), grads_.end(), 0.0f); }

void Model::PadFlatBuffers(size_t n) {
  if (n <= params_.size()) return;
  params_.resize(n, 0.0f);
  grads_.resize(n, 0.0f);
}

float Model::Forward(const int* tokens, const int* targets, int B, int T) {
  Resize(B, T);
  const ModelConfig& c = config();
  const size_t n = static_cast<size_t>(B) * T;
  tokens_.assign(tokens, tokens + n);
  if (targets != nullptr) {
    targets_.assign(targets, targets + n);
  } else {
    targets_.clear();
  }
  for (int x : tokens_) DSL_CHECK(x >= 0 && x < c.vocab_size);
  for (int x : targets_) DSL_CHECK(x >= 0 && x < c.vocab_size);

  CallHook(hooks_.before_forward, -1);
  EncoderForward(ptrs_->encoded, tokens_.data(), P(K::kWte), P(K::kWpe), B, T,
                 c.channels);
  CallHook(hooks_.after_forward, -1);
  for (int l = 0; l < c.num_layers; l++) {
    CallHook(hooks_.before_forward, l);
    BlockForward(l, BlockInput(l));
    CallHook(hooks_.after_forward, l);
  }
  CallHook(hooks_.before_forward, c.num_layers);
  const float loss = HeadForward(BlockInput(c.num_layers));
  CallHook(hooks_.after_forward, c.num_layers);
  backward_ready_ = !targets_.empty();
  return loss;
}

void Model::BlockForward(int l, const float* res_in) {
  const int N = B_ * T_, C = config().channels;
  const size_t NC = static_cast<size_t>(N) * C;
  Acts::Layer& a = ptrs_->layers[l];
  float* scratch = ptrs_->scratch;
  float* scratch4 = ptrs_->scratch4;
  LayerNormForward(a.ln1, a.ln1_mean, a.ln1_rstd, res_in, P(K::kLn1w, l),
                   P(K::kLn1b, l), N, C);
  MatmulForward(a.qkv, a.ln1, P(K::kQkvw, l), P(K::kQkvb, l), N, C, 3 * C);
  AttentionForward(a.atty, a.lse, a.qkv, B_, T_, C, config().num_heads);
  MatmulForward(scratch, a.atty, P(K::kAttprojw, l), P(K::kAttprojb, l), N, C,
                C);
  ResidualForward(a.res2, res_in, scratch, NC);
  LayerNormForward(a.ln2, a.ln2_mean, a.ln2_rstd, a.res2, P(K::kLn2w, l),
                   P(K::kLn2b, l), N, C);
  MatmulForward(a.fch, a.ln2, P(K::kFcw, l), P(K::kFcb, l), N, C, 4 * C);
  GeluForward(scratch4, a.fch, 4 * NC);
  MatmulForward(scratch, scratch4, P(K::kFcprojw, l), P(K::kFcprojb, l), N,
                4 * C, C);
  ResidualForward(a.res3, a.res2, scratch, NC);
}

float Model::HeadForward(const float* res_in) {
  const ModelConfig& c = config();
  const int N = B_ * T_, C = c.channels, V = c.vocab_size;
  const int Vp = c.padded_vocab_size;
  Acts& a = *ptrs_;
  LayerNormForward(a.lnf, a.lnf_mean, a.lnf_rstd, res_in, P(K::kLnfw),
                   P(K::kLnfb), N, C);
  // Logits for the real vocabulary only (ldc = Vp); the padding columns are
  // never read and the softmax writes them as 0.
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, N, V, C, 1.0f, a.lnf, C,
              P(K::kWte), C, 0.0f, a.logits, Vp);
  const int* targets = targets_.empty() ? nullptr : targets_.data();
  CrossEntropySoftmaxForward(a.logits, a.losses, a.logits, targets, N, V, Vp);
  if (targets == nullptr) return -1.0f;
  double sum = 0.0;
  for (int i = 0; i < N; i++) sum += a.losses[i];
  return static_cast<float>(sum / N);
}

void Model::Backward(float loss_scale) {
  DSL_CHECK(backward_ready_);
  backward_ready_ = false;
  const int L = config().num_layers;
  CallHook(hooks_.before_backward, L);
  HeadBackward(BlockInput(L), loss_scale / static_cast<float>(B_ * T_));
  CallHook(hooks_.after_backward, L);
  for (int l = L - 1; l >= 0; l--) {
    CallHook(hooks_.before_backward, l);
    BlockBackward(l, BlockInput(l));
    CallHook(hooks_.after_backward, l);
  }
  CallHook(hooks_.before_backward, -1);
  EncoderBackward(G(K::kWte), G(K::kWpe), ptrs_->dres, tokens_.data(), B_, T_,
                  config().channels);
  CallHook(hooks_.after_backward, -1);
}

// Leaves d(loss)/d(res_in) in dres.
void Model::HeadBackward(const float* res_in, float dloss) {
  const ModelConfig& c = config();
  const int N = B_ * T_, C = c.channels, V = c.vocab_size;
  const int Vp = c.padded_vocab_size;
  Acts& a = *ptrs_;
  float* dlogits = a.logits;  // in place over the probabilities
  CrossEntropySoftmaxBackward(dlogits, a.logits, targets_.data(), dloss, N, V,
                              Vp);
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, N, C, V, 1.0f, dlogits,
              Vp, P(K::kWte), C, 0.0f, a.dbtc, C);
  cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, V, C, N, 1.0f, dlogits,
              Vp, a.lnf, C, 1.0f, G(K::kWte), C);
  Zero(a.dres, static_cast<size_t>(N) * C);
  LayerNormBackward(a.dres, G(K::kLnfw), G(K::kLnfb), a.dbtc, res_in,
                    P(K::kLnfw), a.lnf_mean, a.lnf_rstd, N, C);
}

// On entry dres holds d(loss)/d(res3 of block l); on exit d(loss)/d(res_in).
// The residual additions need no kernel: dres flows through and the
// LayerNorm backward passes accumulate into it.
void Model::BlockBackward(int l, const float* res_in) {
  const int N = B_ * T_, C = config().channels;
  const size_t NC = static_cast<size_t>(N) * C;
  const Acts::Layer& a = ptrs_->layers[l];
  Acts& s = *ptrs_;
  GeluForward(s.scratch4, a.fch, 4 * NC);  // recomputed, not saved
  Zero(s.d4, 4 * NC);
  MatmulBackward(s.d4, G(K::kFcprojw, l), G(K::kFcprojb, l), s.dres, s.scratch4,
                 P(K::kFcprojw, l), N, 4 * C, C);
  Zero(s.scratch4, 4 * NC);  // now d(fch)
  GeluBackward(s.scratch4, a.fch, s.d4, 4 * NC);
  Zero(s.dbtc, NC);
  MatmulBackward(s.dbtc, G(K::kFcw, l), G(K::kFcb, l), s.scratch4, a.ln2,
                 P(K::kFcw, l), N, C, 4 * C);
  LayerNormBackward(s.dres, G(K::kLn2w, l), G(K::kLn2b, l), s.dbtc, a.res2,
                    P(K::kLn2w, l), a.ln2_mean, a.ln2_rstd, N, C);
  Zero(s.dbtc, NC);
  MatmulBackward(s.dbtc, G(K::kAttprojw, l), G(K::kAttprojb, l), s.dres, a.atty,
                 P(K::kAttprojw, l), N, C, C);
  Zero(s.dqkv, 3 * NC);
  AttentionBackward(s.dqkv, s.dbtc, a.qkv, a.lse, B_, T_, C,
                    config().num_heads);
  Zero(s.dbtc, NC);
  MatmulBackward(s.dbtc, G(K::kQkvw, l), G(K::kQkvb, l), s.dqkv, a.ln1,
                 P(K::kQkvw, l), N, C, 3 * C);
  LayerNormBackward(s.dres, G(K::kLn1w, l), G(K::kLn1b, l), s.dbtc, res_in,
                    P(K::kLn1w, l), a.ln1_mean, a.ln1_rstd, N, C);
}

// ---------------------------------------------------------------- files

namespace {

struct FileCloser {
  void operator()(std::FILE* f) const { std::fclose(f); }
};
using FilePtr = std::unique_ptr<std::FILE, FileCloser>;

StatusOr<FilePtr> OpenForRead(const std::string& path) {
  std::FILE* f = std::fopen(path.c_str(), "rb");
  if (f == nullptr) {
    const int err = errno;
    std::string m = path + ": " + std::strerror(err);
    return err == ENOENT ? NotFound(m) : DataError(m);
  }
  return FilePtr(f);
}

std::string Describe(const ModelConfig& c) {
  return "maxT " + std::to_string(c.max_seq_len) + ", V " +
         std::to_string(c.vocab_size) + ", Vp " +
         std::to_string(c.padded_vocab_size) + ", L " +
         std::to_string(c.num_layers) + ", NH " + std::to_string(c.num_heads) +
         ", C " + std::to_string(c.channels);
}

StatusOr<ModelConfig> ReadHeader(std::FILE* f, const std::string& path) {
  int32_t h[256];
  if (std::fread(h, sizeof(int32_t), 256, f) != 256) {
    return DataError(path + ": truncated model file (header shorter than " +
                     "1024 bytes)");
  }
  if (h[0] != kModelFileMagic) {
    return DataError(path + ": not an llm.c model file (magic " +
                     std::to_string(h[0]) + ", expected 20240326)");
  }
  if (h[1] != kModelFileVersionFp32) {
    return DataError(path + ": model file version " + std::to_string(h[1]) +
                     " is not supported (only 3, fp32" +
                     (h[1] == 5 ? "; 5 is bf16)" : ")"));
  }
  ModelConfig c;
  c.max_seq_len = h[2];
  c.vocab_size = h[3];
  c.num_layers = h[4];
  c.num_heads = h[5];
  c.channels = h[6];
  c.padded_vocab_size = h[7];
  const Status valid = c.Validate();
  if (!valid.ok()) return DataError(path + ": bad header: " + valid.message());
  return c;
}

}  // namespace

Status WriteModelFile(const std::string& path, const ParamLayout& layout,
                      std::span<const float> params) {
  DSL_CHECK(params.size() == layout.num_params());
  const ModelConfig& c = layout.config();
  int32_t h[256] = {};
  h[0] = kModelFileMagic;
  h[1] = kModelFileVersionFp32;
  h[2] = c.max_seq_len;
  h[3] = c.vocab_size;
  h[4] = c.num_layers;
  h[5] = c.num_heads;
  h[6] = c.channels;
  h[7] = c.padded_vocab_size;
  const std::string tmp = path + ".tmp";
  std::FILE* f = std::fopen(tmp.c_str(), "wb");
  if (f == nullptr) return ErrnoStatus("cannot create " + tmp, errno);
  bool ok = std::fwrite(h, sizeof(int32_t), 256, f) == 256;
  for (const TensorInfo& t : layout.Tensors()) {
    const size_t n = t.range.size();
    ok = ok &&
         std::fwrite(params.data() + t.range.begin, sizeof(float), n, f) == n;
  }
  int err = errno;
  if (std::fclose(f) != 0 && ok) {
    ok = false;
    err = errno;
  }
  if (!ok) {
    std::remove(tmp.c_str());
    return ErrnoStatus("cannot write " + tmp, err);
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    return ErrnoStatus("cannot rename " + tmp + " to " + path, errno);
  }
  return Status::Ok();
}

StatusOr<ModelConfig> ReadModelFileConfig(const std::string& path) {
  ASSIGN_OR_RETURN(FilePtr f, OpenForRead(path));
  return ReadHeader(f.get(), path);
}

Status ReadModelFileParams(const std::string& path, const ParamLayout& layout,
                           std::span<float> params) {
  DSL_CHECK(params.size() == layout.num_params());
  ASSIGN_OR_RETURN(FilePtr f, OpenForRead(path));
  ASSIGN_OR_RETURN(ModelConfig c, ReadHeader(f.get(), path));
  if (!(c == layout.config())) {
    return DataError(path + ": model is " + Describe(c) + ", expected " +
                     Describe(layout.config()));
  }
  const std::string total = std::to_string(layout.num_params());
  size_t got = 0;
  for (const TensorInfo& t : layout.Tensors()) {
    const size_t n = std::fread(params.data() + t.range.begin, sizeof(float),
                                t.range.size(), f.get());
    got += n;
    if (n != t.range.size()) {
      return DataError(path + ": truncated model file (" + std::to_string(got) +
                       " of " + total + " parameters)");
    }
  }
  if (std::fgetc(f.get()) != EOF) {
    return DataError(path + ": trailing bytes after the " + total +
                     " parameters");
  }
  return Status::Ok();
}

StatusOr<std::unique_ptr<Model>> ReadModelFile(const std::string& path,
                                               ParamOrder order) {
  ASSIGN_OR_RETURN(ModelConfig c, ReadModelFileConfig(path));
  ASSIGN_OR_RETURN(std::unique_ptr<Model> model, Model::Create(c, order));
  RETURN_IF_ERROR(ReadModelFileParams(path, model->layout(), model->params()));
  return model;
}

}  // namespace dslaunch::worker
