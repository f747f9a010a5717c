#include "worker/model.h"

#include <algorithm>  // fill
#include <cstring>    // memset

#include "worker/kernels_cpu.h"

namespace dslaunch::worker {

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

void Model::InitParams(uint64_t seed) {
  DSL_CHECK(source_ == nullptr);
  const size_t n = layout_.num_params();
  std::fill(params_.begin() + n, params_.end(), 0.0f);  // PadFlatBuffers
  InitParamRange(layout_, seed, ParamRange{0, n},
                 std::span<float>(params_).first(n));
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

void Model::set_param_source(ParamSource* source) {
  DSL_CHECK(layout_.order() == ParamOrder::kLayerMajor);
  DSL_CHECK(source != nullptr && source_ == nullptr);
  source_ = source;
  const int L = config().num_layers;
  for (int l = -1; l <= L; l++) {
    layer_begin_.push_back(layout_.LayerRanges(l)[0].begin);
  }
  std::vector<float>().swap(params_);
  std::vector<float>().swap(grads_);
}

float* Model::Locate(ParamKind kind, int layer, bool grad) {
  const size_t offset = layout_.Offset(kind, layer);
  if (source_ == nullptr) return (grad ? grads_ : params_).data() + offset;
  const int owner = layout_.HookLayer(kind, layer);
  float* base = grad ? source_->LayerGrads(owner) : source_->LayerParams(owner);
  DSL_CHECK(base != nullptr);
  return base + (offset - layer_begin_[owner + 1]);
}

float* Model::P(ParamKind kind, int layer) {
  return Locate(kind, layer, false);
}

float* Model::G(ParamKind kind, int layer) { return Locate(kind, layer, true); }

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
  DSL_CHECK(source_ == nullptr);
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
  Gemm(Transpose::kNo, Transpose::kYes, N, V, C, 1.0f, a.lnf, C, P(K::kWte), C,
       0.0f, a.logits, Vp);
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
  Gemm(Transpose::kNo, Transpose::kNo, N, C, V, 1.0f, dlogits, Vp, P(K::kWte),
       C, 0.0f, a.dbtc, C);
  Gemm(Transpose::kYes, Transpose::kNo, V, C, N, 1.0f, dlogits, Vp, a.lnf, C,
       1.0f, G(K::kWte), C);
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

StatusOr<std::unique_ptr<Model>> ReadModelFile(const std::string& path,
                                               ParamOrder order) {
  ASSIGN_OR_RETURN(ModelConfig c, ReadModelFileConfig(path));
  ASSIGN_OR_RETURN(std::unique_ptr<Model> model, Model::Create(c, order));
  RETURN_IF_ERROR(ReadModelFileParams(path, model->layout(), model->params()));
  return model;
}

}  // namespace dslaunch::worker
