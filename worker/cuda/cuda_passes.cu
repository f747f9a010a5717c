// CudaEngine (cuda_engine.h): the activations, carved for B x T, and the
// forward and backward passes over them, with the host's layer hooks
// between the layers.
#include "worker/cuda/cuda_engine.h"

namespace dslaunch::worker::cuda {

bool CudaEngine::TrainMicroBatch(const int* tokens, const int* targets, int B,
                                 int T, float grad_scale, float* loss) {
  if (!Load(tokens, targets, B, T, /*groups=*/true)) return false;
  // A pass that stopped in a hook may have left gradients in a window.
  if (windows_dirty_) {
    for (int h : {-1, 0, 1}) {
      if (!WritesGradWindow(h)) return false;
      Zero(ctx_, GradWindow(h), WindowFloats(h));
    }
    windows_dirty_ = false;
  }
  windows_dirty_ = options_.windows != DeviceWindows::kNone;
  if (!Forward() || !HeadForward(/*backward=*/true, grad_scale / (B * T)))
    return false;
  if (!Backward()) return false;
  windows_dirty_ = false;
  return MeanLoss(loss);
}

bool CudaEngine::EvalBatch(const int* tokens, const int* targets, int B, int T,
                           float* loss) {
  if (!Load(tokens, targets, B, T, /*groups=*/false)) return false;
  if (!Forward() || !HeadForward(/*backward=*/false, 0)) return false;
  return MeanLoss(loss);
}

bool CudaEngine::Resize(int B, int T) {
  if (B == B_ && T == T_) return true;
  const size_t BT = static_cast<size_t>(B) * T;
  const size_t need = Carve(nullptr, B, T);
  if (need > acts_floats_) {
    Free(acts_);
    acts_ = nullptr;
    acts_floats_ = 0;
    if (!Alloc(&acts_, need)) return false;
    acts_floats_ = need;
  }
  if (BT > token_capacity_) {
    Free(tokens_);
    Free(groups_);
    tokens_ = groups_ = nullptr;
    token_capacity_ = 0;
    // tokens, targets; group tokens, offsets (+1), positions
    if (!Alloc(&tokens_, 2 * BT) || !Alloc(&groups_, 3 * BT + 1)) return false;
    token_capacity_ = BT;
  }
  if (Rounded()) {
    // The largest operands: A the logits' gradient or the widest
    // activation or dout; B the embedding, a weight or (unless they are
    // kept rounded) the widest activation.
    const size_t C = spec_.channels, Vp = spec_.padded_vocab_size;
    const size_t a = BT * std::max(Vp, 4 * C);
    const size_t b =
        std::max({rounded_acts_ ? 0 : BT * 4 * C, Vp * C, 4 * C * C});
    if (a > ctx_.operand_a_elems || b > ctx_.operand_b_elems) {
      Free(ctx_.operand_a);
      Free(ctx_.operand_b);
      ctx_.operand_a = ctx_.operand_b = nullptr;
      ctx_.operand_a_elems = ctx_.operand_b_elems = 0;
      uint16_t *pa = nullptr, *pb = nullptr;  // 2 bytes an element
      if (!Alloc(&pa, a) || !Alloc(&pb, b)) return false;
      ctx_.operand_a = pa;
      ctx_.operand_b = pb;
      ctx_.operand_a_elems = a;
      ctx_.operand_b_elems = b;
    }
  }
  Carve(acts_, B, T);
  B_ = B;
  T_ = T;
  return true;
}

size_t CudaEngine::Carve(float* base, int B, int T) {
  const size_t BT = static_cast<size_t>(B) * T, C = spec_.channels;
  const int NH = spec_.num_heads;
  size_t used = 0;
  // Each buffer at a multiple of 256 bytes (vector loads, cuBLASLt).
  auto take = [&](size_t n) {
    float* r = base != nullptr ? base + used : nullptr;
    used += (n + 63) / 64 * 64;
    return r;
  };
  // n elements of 2 bytes where activations are kept rounded, else none.
  auto take16 = [&](size_t n) -> void* {
    return rounded_acts_ ? take((n + 1) / 2) : nullptr;
  };
  // n floats unless activations are kept rounded (their copy instead).
  auto take32 = [&](size_t n) { return rounded_acts_ ? nullptr : take(n); };
  // qkv in bf16 only where the fused kernels run at this batch's shape
  // (else the batched path, on fp32).
  const bool qkv16 = AttentionFused(ctx_, B, static_cast<int>(C), NH);
  encoded_ = take(BT * C);
  layers_.resize(spec_.num_layers);
  for (Layer& y : layers_) {
    y.ln1 = take32(BT * C);
    y.ln1_16 = take16(BT * C);
    y.ln1_mean = take(BT);
    y.ln1_rstd = take(BT);
    y.qkv = qkv16 ? nullptr : take(3 * BT * C);
    y.qkv16 = qkv16 ? take((3 * BT * C + 1) / 2) : nullptr;
    y.atty = take(BT * C);
    y.atty16 = take16(BT * C);
    y.lse = take(BT * NH);
    y.res2 = take(BT * C);
    y.ln2 = take32(BT * C);
    y.ln2_16 = take16(BT * C);
    y.ln2_mean = take(BT);
    y.ln2_rstd = take(BT);
    y.fch = take(4 * BT * C);
    y.res3 = take(BT * C);
  }
  lnf_ = take32(BT * C);
  lnf16_ = take16(BT * C);
  lnf_mean_ = take(BT);
  lnf_rstd_ = take(BT);
  logits_ = take(BT * spec_.padded_vocab_size);
  losses_ = take(BT);
  scratch4_ = take(4 * BT * C);
  // GELU's rounded output: in scratch4_ (the fp32 modes' GELU output and
  // then its gradient).
  gelu16_ = rounded_acts_ ? static_cast<void*>(scratch4_) : nullptr;
  scratch_ = take(BT * C);
  dres_ = take(BT * C);
  dbtc_ = take(BT * C);
  dqkv_ = take(3 * BT * C);
  d4_ = take(4 * BT * C);
  attn_ws_ = take(AttentionWorkspaceFloats(ctx_, B, T, C, NH, qkv16));
  col_scratch_ = take(LayerNormScratchFloats(4 * C));
  return used;
}

bool CudaEngine::Load(const int* tokens, const int* targets, int B, int T,
                      bool groups) {
  if (B < 1 || T < 1 || T > spec_.max_seq_len)
    return Fail("batch and sequence out of range");
  const size_t n = static_cast<size_t>(B) * T;
  for (size_t i = 0; i < n; i++) {
    if (tokens[i] < 0 || tokens[i] >= spec_.vocab_size || targets[i] < 0 ||
        targets[i] >= spec_.vocab_size) {
      return Fail("token " + std::to_string(i) + " outside the vocabulary");
    }
  }
  if (!Resize(B, T)) return false;
  host_tokens_.assign(tokens, tokens + n);
  host_tokens_.insert(host_tokens_.end(), targets, targets + n);
  if (groups) {
    // (token, position) sorted: each token's positions ascending.
    keys_.resize(n);
    for (size_t i = 0; i < n; i++)
      keys_[i] = (static_cast<uint64_t>(tokens[i]) << 32) | i;
    std::sort(keys_.begin(), keys_.end());
    host_groups_.clear();
    std::vector<int> offsets, positions;
    for (size_t i = 0; i < n; i++) {
      const int tok = static_cast<int>(keys_[i] >> 32);
      if (i == 0 || tok != static_cast<int>(keys_[i - 1] >> 32)) {
        host_groups_.push_back(tok);
        offsets.push_back(static_cast<int>(i));
      }
      positions.push_back(static_cast<int>(keys_[i] & 0xffffffffu));
    }
    n_unique_ = static_cast<int>(host_groups_.size());
    offsets.push_back(static_cast<int>(n));
    host_groups_.insert(host_groups_.end(), offsets.begin(), offsets.end());
    host_groups_.insert(host_groups_.end(), positions.begin(), positions.end());
    if (!Cuda(cudaMemcpyAsync(groups_, host_groups_.data(),
                              host_groups_.size() * sizeof(int),
                              cudaMemcpyHostToDevice, ctx_.stream),
              "copy token groups"))
      return false;
  }
  return Cuda(cudaMemcpyAsync(tokens_, host_tokens_.data(), 2 * n * sizeof(int),
                              cudaMemcpyHostToDevice, ctx_.stream),
              "copy tokens");
}

bool CudaEngine::Forward() {
  const int C = spec_.channels;
  // No block window filled yet in this pass (ParamWindowFree).
  if (!ParamWindowsIdle()) return false;
  if (!BeforeForwardHook(-1)) return false;
  Mark(Profile::kEmbedding);
  EncoderForward(ctx_, encoded_, tokens_, P(kWte), P(kWpe), B_, T_, C);
  for (int l = 0; l < spec_.num_layers; l++) {
    if (!BeforeForwardHook(l) || !BlockForward(l, BlockInput(l))) return false;
  }
  return Launched("forward");
}

bool CudaEngine::BlockForward(int l, const float* res_in) {
  const int N = B_ * T_, C = spec_.channels;
  const size_t NC = static_cast<size_t>(N) * C;
  Layer& a = layers_[l];
  Mark(Profile::kLayerNorm);
  LayerNormForward(ctx_, a.ln1, a.ln1_mean, a.ln1_rstd, res_in, P(kLn1w, l),
                   P(kLn1b, l), N, C, a.ln1_16);
  // With the fused attention qkv is kept in bf16 only (the fp32 result
  // goes to scratch4_, free until GELU, and is rounded from there).
  if (!Linear(l, kQkvw, a.qkv != nullptr ? a.qkv : scratch4_,
              In(a.ln1, a.ln1_16), C, 3 * C, "qkv", a.qkv16))
    return false;
  Mark(Profile::kAttention);
  if (!Blas(AttentionForward(ctx_, a.atty, a.lse, a.qkv, B_, T_, C,
                             spec_.num_heads, attn_ws_, a.atty16, a.qkv16),
            "attention"))
    return false;
  if (!Linear(l, kAttprojw, scratch_, In(a.atty, a.atty16), C, C, "attproj"))
    return false;
  Mark(Profile::kLayerNorm);
  ResidualLayerNormForward(ctx_, a.res2, a.ln2, a.ln2_mean, a.ln2_rstd, res_in,
                           scratch_, P(kLn2w, l), P(kLn2b, l), N, C, a.ln2_16);
  if (!Linear(l, kFcw, a.fch, In(a.ln2, a.ln2_16), C, 4 * C, "fc"))
    return false;
  Mark(Profile::kPointwise);
  GeluForward(ctx_, scratch4_, a.fch, 4 * NC, gelu16_);
  if (!Linear(l, kFcprojw, scratch_, In(scratch4_, gelu16_), 4 * C, C,
              "fcproj"))
    return false;
  Mark(Profile::kPointwise);
  ResidualForward(ctx_, a.res3, a.res2, scratch_, NC);
  return true;
}

bool CudaEngine::Linear(int l, Kind weight, float* out, Operand inp, int in,
                        int out_width, const char* what, void* out_bf16) {
  Mark(Profile::kMatmul);
  return Blas(MatmulForward(ctx_, out, inp, P(weight, l), P(BiasOf(weight), l),
                            B_ * T_, in, out_width, out_bf16),
              what);
}

bool CudaEngine::LinearBackward(int l, Kind weight, float* dinp, Operand dout,
                                Operand inp, int in, int out_width,
                                const char* what, bool bias) {
  Mark(Profile::kMatmul);
  return Blas(MatmulBackward(ctx_, dinp, G(weight, l),
                             bias ? G(BiasOf(weight), l) : nullptr, dout, inp,
                             P(weight, l), B_ * T_, in, out_width, col_scratch_,
                             /*dinp_beta=*/0.0f),
              what);
}

bool CudaEngine::HeadForward(bool backward, float dloss) {
  const int N = B_ * T_, C = spec_.channels, V = spec_.vocab_size;
  const int Vp = spec_.padded_vocab_size;
  if (!BeforeForwardHook(spec_.num_layers)) return false;
  Mark(Profile::kLayerNorm);
  LayerNormForward(ctx_, lnf_, lnf_mean_, lnf_rstd_,
                   BlockInput(spec_.num_layers), P(kLnfw), P(kLnfb), N, C,
                   lnf16_);
  Mark(Profile::kHead);
  // The head's three products run over all Vp rows of wte, not V: a width
  // that is a multiple of 64 keeps cuBLAS on its fast tensor-core paths
  // (50257 did not: 25 of the 139 ms of a GPT-2 step on an H200). The
  // same numbers: the classifier ignores the padding columns' logits and
  // writes 0 as their gradient, which adds nothing to dlnf and dwte.
  if (!Blas(RowGemm(ctx_, false, true, N, Vp, C, 1.0f, In(lnf_, lnf16_), C,
                    P(kWte), C, 0.0f, logits_, Vp),
            "logits"))
    return false;
  Mark(Profile::kClassifier);
  // In the 16-bit modes the logits' gradient goes straight to the head's
  // A operand, rounded: Backward's two products take it from there.
  FusedClassifier(ctx_, logits_, losses_, tokens_ + N, N, V, Vp, dloss,
                  backward, Rounded() ? ctx_.operand_a : nullptr);
  return Launched("classifier");
}

bool CudaEngine::Backward() {
  const int N = B_ * T_, C = spec_.channels;
  const int Vp = spec_.padded_vocab_size, L = spec_.num_layers;
  // The logits' gradient: over the logits, or rounded by the classifier.
  const Operand dlogits = In(logits_, Rounded() ? ctx_.operand_a : nullptr);
  if (!BeforeBackwardHook(L)) return false;
  // dwte here, dwpe and dwte at the end; the final LayerNorm's.
  if (!WritesGradWindow(-1) || !WritesGradWindow(L)) return false;
  Mark(Profile::kHead);
  if (!Blas(RowGemm(ctx_, false, false, N, C, Vp, 1.0f, dlogits, Vp, P(kWte), C,
                    0.0f, dbtc_, C),
            "dlnf"))
    return false;
  if (!Blas(RowGemm(ctx_, true, false, Vp, C, N, 1.0f, dlogits, Vp,
                    In(lnf_, lnf16_), C, 1.0f, G(kWte), C),
            "dwte"))
    return false;
  Mark(Profile::kPointwise);
  Zero(ctx_, dres_, static_cast<size_t>(N) * C);
  Mark(Profile::kLayerNorm);
  cuda::LayerNormBackward(ctx_, dres_, G(kLnfw), G(kLnfb), dbtc_, BlockInput(L),
                          P(kLnfw), lnf_mean_, lnf_rstd_, N, C, col_scratch_);
  if (!AfterBackwardHook(L)) return false;
  for (int l = L - 1; l >= 0; l--) {
    if (!BeforeBackwardHook(l) || !WritesGradWindow(l) ||
        !BlockBackward(l, BlockInput(l)) || !AfterBackwardHook(l))
      return false;
  }
  if (!BeforeBackwardHook(-1)) return false;
  Mark(Profile::kEmbedding);
  EncoderBackwardWpe(ctx_, G(kWpe), dres_, B_, T_, C);
  EncoderBackwardWte(ctx_, G(kWte), dres_, groups_, groups_ + n_unique_,
                     groups_ + 2 * n_unique_ + 1, n_unique_, C);
  if (!Launched("backward")) return false;
  return AfterBackwardHook(-1);
}

bool CudaEngine::BlockBackward(int l, const float* res_in) {
  const int N = B_ * T_, C = spec_.channels;
  const size_t NC = static_cast<size_t>(N) * C;
  const Layer& a = layers_[l];
  Mark(Profile::kPointwise);
  GeluForward(ctx_, scratch4_, a.fch, 4 * NC, gelu16_);  // recomputed
  if (!LinearBackward(l, kFcprojw, d4_, dres_, In(scratch4_, gelu16_), 4 * C, C,
                      "fcproj backward"))
    return false;
  // GELU's backward with fc's bias gradient, rounded for fc's products in
  // the 16-bit modes, in one pass.
  Mark(Profile::kPointwise);
  void* dfch16 = Rounded() ? ctx_.operand_a : nullptr;
  GeluBackwardBias(ctx_, scratch4_, dfch16, G(kFcb, l), a.fch, d4_, N, 4 * C,
                   col_scratch_);
  if (!LinearBackward(l, kFcw, dbtc_, In(scratch4_, dfch16),
                      In(a.ln2, a.ln2_16), C, 4 * C, "fc backward",
                      /*bias=*/false))
    return false;
  Mark(Profile::kLayerNorm);
  cuda::LayerNormBackward(ctx_, dres_, G(kLn2w, l), G(kLn2b, l), dbtc_, a.res2,
                          P(kLn2w, l), a.ln2_mean, a.ln2_rstd, N, C,
                          col_scratch_);
  if (!LinearBackward(l, kAttprojw, dbtc_, dres_, In(a.atty, a.atty16), C, C,
                      "attproj backward"))
    return false;
  Mark(Profile::kAttention);
  if (!Blas(AttentionBackward(ctx_, dqkv_, dbtc_, a.qkv, a.atty, a.lse, B_, T_,
                              C, spec_.num_heads, attn_ws_,
                              /*add=*/false, a.qkv16),
            "attention backward"))
    return false;
  if (!LinearBackward(l, kQkvw, dbtc_, dqkv_, In(a.ln1, a.ln1_16), C, 3 * C,
                      "qkv backward"))
    return false;
  Mark(Profile::kLayerNorm);
  cuda::LayerNormBackward(ctx_, dres_, G(kLn1w, l), G(kLn1b, l), dbtc_, res_in,
                          P(kLn1w, l), a.ln1_mean, a.ln1_rstd, N, C,
                          col_scratch_);
  return true;
}

bool CudaEngine::MeanLoss(float* loss) {
  const size_t n = static_cast<size_t>(B_) * T_;
  host_losses_.resize(n);
  if (!Down(host_losses_.data(), losses_, n)) return false;
  double sum = 0;
  for (float x : host_losses_) sum += x;
  *loss = static_cast<float>(sum / static_cast<double>(n));
  return true;
}

}  // namespace dslaunch::worker::cuda
