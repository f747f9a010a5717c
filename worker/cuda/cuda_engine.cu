// CudaEngine: worker/device_engine.h's DeviceEngine on one CUDA GPU. The
// GPT-2 forward and backward pass of worker/model.cc, step for step, over
// device buffers with worker/cuda/kernels_cuda.h; AdamW and the gradient
// norm on the device. Built into libdsl_cuda.so, which dsworker opens with
// dlopen (worker/device_loader.cc) only for --device cuda or auto.
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "worker/cuda/kernels_cuda.h"
#include "worker/cuda/nccl_comm.h"
#include "worker/cuda/profile.h"
#include "worker/device_engine.h"

namespace dslaunch::worker::cuda {
namespace {

// ParamKind's order (worker/param_layout.h).
enum Kind {
  kWte,
  kWpe,
  kLn1w,
  kLn1b,
  kQkvw,
  kQkvb,
  kAttprojw,
  kAttprojb,
  kLn2w,
  kLn2b,
  kFcw,
  kFcb,
  kFcprojw,
  kFcprojb,
  kLnfw,
  kLnfb,
};

class CudaEngine final : public DeviceEngine {
 public:
  explicit CudaEngine(const DeviceEngineOptions& options)
      : options_(options),
        spec_(options.model),
        profile_(std::getenv("DSL_CUDA_PROFILE") != nullptr &&
                 std::string(std::getenv("DSL_CUDA_PROFILE")) == "1") {}
  ~CudaEngine() override {
    if (ctx_.stream != nullptr) cudaStreamSynchronize(ctx_.stream);
    nccl_.Close();  // before the buffers and the stream go
    profile_.Collect();
    profile_.Print();
    for (cudaEvent_t e : grad_copied_)
      if (e != nullptr) cudaEventDestroy(e);
    for (void* p : pinned_) cudaHostUnregister(p);
    for (const auto& a : allocations_) cudaFree(a.first);
    LtDestroy(ctx_.lt);
    if (ctx_.blas != nullptr) cublasDestroy(ctx_.blas);
    if (ctx_.stream != nullptr) cudaStreamDestroy(ctx_.stream);
  }

  bool Init() {
    if (!Cuda(cudaSetDevice(options_.device), "cudaSetDevice")) return false;
    cudaDeviceProp prop{};
    if (!Cuda(cudaGetDeviceProperties(&prop, options_.device),
              "cudaGetDeviceProperties"))
      return false;
    char text[512];
    std::snprintf(text, sizeof text, "%s, sm_%d%d, %.1f GiB, %s", prop.name,
                  prop.major, prop.minor,
                  static_cast<double>(prop.totalGlobalMem) / (1 << 30),
                  PrecisionName());
    describe_ = text;
    if (!Cuda(cudaStreamCreateWithFlags(&ctx_.stream, cudaStreamNonBlocking),
              "cudaStreamCreate"))
      return false;
    if (!Blas(cublasCreate(&ctx_.blas), "cublasCreate")) return false;
    if (!Blas(cublasSetStream(ctx_.blas, ctx_.stream), "cublasSetStream"))
      return false;
    ctx_.lt = LtCreate();  // null: the biases written before the products
    switch (options_.precision) {
      case DevicePrecision::kFp32:
        ctx_.compute = CUBLAS_COMPUTE_32F;
        break;
      case DevicePrecision::kTf32:
        ctx_.compute = CUBLAS_COMPUTE_32F_FAST_TF32;
        break;
      case DevicePrecision::kBf16:
      case DevicePrecision::kFp16:
        // The linear layers on 16-bit operands (scratch sized in Resize);
        // attention's batched products on tf32.
        ctx_.operands = options_.precision == DevicePrecision::kBf16
                            ? CUDA_R_16BF
                            : CUDA_R_16F;
        ctx_.compute = CUBLAS_COMPUTE_32F_FAST_TF32;
        break;
    }
    ctx_.batched_compute = ctx_.compute;
    // The fused attention kernels (bf16 operands) in the 16-bit modes,
    // unless DSL_CUDA_ATTENTION=batched asks for the batched products
    // (which fp32 and tf32 always take: the fused kernels' bf16 operands
    // would lose their precision).
    const char* env = std::getenv("DSL_CUDA_ATTENTION");
    const std::string attention = env != nullptr ? env : "";
    if (!attention.empty() && attention != "fused" && attention != "batched")
      return Fail("DSL_CUDA_ATTENTION=" + attention + ": not fused or batched");
    ctx_.fused_attention =
        Rounded() && attention != "batched" &&
        FlashAttentionSupported(1, spec_.channels, spec_.num_heads);
    if (ctx_.fused_attention) describe_ += ", fused attention";
    // In the 16-bit modes the activations the products read (the
    // LayerNorms', GELU's and attention's outputs) are written rounded, once,
    // and kept so (half the bytes); DSL_CUDA_ACTIVATIONS=fp32 keeps them in
    // fp32, rounded before each product (the earlier path, the same numbers).
    const char* acts = std::getenv("DSL_CUDA_ACTIVATIONS");
    const std::string acts_mode = acts != nullptr ? acts : "";
    if (!acts_mode.empty() && acts_mode != "fp32" && acts_mode != "16bit")
      return Fail("DSL_CUDA_ACTIVATIONS=" + acts_mode + ": not fp32 or 16bit");
    rounded_acts_ = Rounded() && acts_mode != "fp32";
    if (Rounded() && !rounded_acts_) describe_ += ", fp32 activations";
    if (!CheckOptions()) return false;
    const size_t n = spec_.num_params;
    const bool windows = options_.windows != DeviceWindows::kNone;
    const size_t whole = std::max(n, options_.padded_floats);
    param_count_ = options_.windows == DeviceWindows::kParamsAndGrads
                       ? options_.owned_count
                       : whole;
    grad_count_ = windows ? options_.owned_count : whole;
    moments_count_ = options_.moments_count;
    if (!AllocZero(&params_, param_count_) ||
        !AllocZero(&grads_, grad_count_) || !AllocZero(&m_, moments_count_) ||
        !AllocZero(&v_, moments_count_) ||
        !Alloc(&partials_, kSquaredSumBlocks)) {
      return false;
    }
    if (windows) {
      // One window for the embedding (it stays from the head's backward to
      // its own) and one every other layer takes in turn, each at least
      // what the host asks (for collectives on them).
      window_floats_[0] = std::max(LayerSize(-1), options_.window_floats[0]);
      window_floats_[1] = options_.window_floats[1];
      for (int l = 0; l <= spec_.num_layers; ++l)
        window_floats_[1] = std::max(window_floats_[1], LayerSize(l));
      if (!AllocZero(&grad_window_[0], WindowFloats(-1)) ||
          !AllocZero(&grad_window_[1], WindowFloats(0)))
        return false;
      // An event after each layer's gradient copy (TakeLayerGrads).
      grad_copied_.assign(spec_.num_layers + 2, nullptr);
      for (cudaEvent_t& e : grad_copied_) {
        if (!Cuda(cudaEventCreateWithFlags(&e, cudaEventDisableTiming),
                  "cudaEventCreate"))
          return false;
      }
      if (options_.windows == DeviceWindows::kParamsAndGrads &&
          (!AllocZero(&param_window_[0], WindowFloats(-1)) ||
           !AllocZero(&param_window_[1], WindowFloats(0))))
        return false;
    }
    return Sync("init");
  }

  std::string Describe() const override { return describe_; }
  const std::string& error() const override { return error_; }

  bool SetParams(const float* host) override {
    return Up(params_, host, param_count_);
  }
  bool GetParams(float* host) override {
    return Down(host, params_, param_count_);
  }
  bool SetGrads(const float* host) override {
    return Up(grads_, host, grad_count_);
  }
  bool GetGrads(float* host) override {
    return Down(host, grads_, grad_count_);
  }
  bool SetMoments(const float* m, const float* v) override {
    return moments_count_ == 0 ||
           (Up(m_, m, moments_count_) && Up(v_, v, moments_count_));
  }
  bool GetMoments(float* m, float* v) override {
    return moments_count_ == 0 ||
           (Down(m, m_, moments_count_) && Down(v, v_, moments_count_));
  }
  bool StartSetParams(size_t begin, size_t count, const float* host) override {
    if (begin > param_count_ || count > param_count_ - begin)
      return Fail("StartSetParams past the parameters");
    if (Cuda(cudaMemcpyAsync(params_ + begin, host, count * sizeof(float),
                             cudaMemcpyHostToDevice, ctx_.stream),
             "copy parameters to the GPU"))
      return true;
    cudaStreamSynchronize(ctx_.stream);  // no copy left running
    return false;
  }
  bool WaitSetParams() override { return Sync("copy parameters to the GPU"); }
  bool SetLayerParams(int layer, const float* host) override {
    if (options_.windows != DeviceWindows::kParamsAndGrads || !IsLayer(layer))
      return Fail("SetLayerParams without parameter windows");
    return Up(ParamWindow(layer), host, LayerSize(layer));
  }
  bool TakeLayerGrads(int layer, float* host) override {
    if (options_.windows == DeviceWindows::kNone || !IsLayer(layer))
      return Fail("TakeLayerGrads without gradient windows");
    float* w = GradWindow(layer);
    if (!Cuda(cudaMemcpyAsync(host, w, LayerSize(layer) * sizeof(float),
                              cudaMemcpyDeviceToHost, ctx_.stream),
              "copy a gradient window from the GPU"))
      return false;
    Zero(ctx_, w, LayerSize(layer));
    if (Launched("zero a gradient window") &&
        Cuda(cudaEventRecord(grad_copied_[layer + 1], ctx_.stream),
             "cudaEventRecord"))
      return true;
    cudaStreamSynchronize(ctx_.stream);  // no copy left running
    return false;
  }
  bool WaitLayerGrads(int layer) override {
    if (options_.windows == DeviceWindows::kNone || !IsLayer(layer))
      return Fail("WaitLayerGrads without gradient windows");
    return Cuda(cudaEventSynchronize(grad_copied_[layer + 1]),
                "copy a gradient window from the GPU");
  }
  bool ZeroGrad() override {
    profile_.StepDone();  // a step starts
    if (grad_count_ > 0) Zero(ctx_, grads_, grad_count_);
    return Launched("zero grad");
  }

  bool TrainMicroBatch(const int* tokens, const int* targets, int B, int T,
                       float grad_scale, float* loss) override {
    if (!Load(tokens, targets, B, T, /*groups=*/true)) return false;
    // A pass that stopped in a hook may have left gradients in a window.
    if (windows_dirty_) {
      for (int h : {-1, 0}) Zero(ctx_, GradWindow(h), WindowFloats(h));
      windows_dirty_ = false;
    }
    windows_dirty_ = options_.windows != DeviceWindows::kNone;
    if (!Forward() || !HeadForward(/*backward=*/true, grad_scale / (B * T)))
      return false;
    if (!Backward()) return false;
    windows_dirty_ = false;
    return MeanLoss(loss);
  }

  bool EvalBatch(const int* tokens, const int* targets, int B, int T,
                 float* loss) override {
    if (!Load(tokens, targets, B, T, /*groups=*/false)) return false;
    if (!Forward() || !HeadForward(/*backward=*/false, 0)) return false;
    return MeanLoss(loss);
  }

  bool GradSquaredSum(size_t begin, size_t count, double* out) override {
    if (begin > grad_count_ || count > grad_count_ - begin)
      return Fail("GradSquaredSum past the gradients");
    Mark(Profile::kOptimizer);
    SquaredSumPartials(ctx_, grads_ + begin, count, partials_);
    double host[kSquaredSumBlocks];
    if (!Cuda(cudaMemcpyAsync(host, partials_, sizeof host,
                              cudaMemcpyDeviceToHost, ctx_.stream),
              "copy norm partials") ||
        !Sync("gradient norm")) {
      return false;
    }
    double sum = 0;
    for (double x : host) sum += x;
    *out = sum;
    return true;
  }

  bool AdamStep(const DeviceAdam& a, float grad_scale) override {
    if (options_.adam.empty()) return true;  // nothing here is ours
    AdamConstants k =
        MakeAdamConstants(a.lr, a.beta1, a.beta2, a.eps, a.weight_decay,
                          a.adamw_mode, a.step, /*decay=*/false);
    Mark(Profile::kOptimizer);
    for (const DeviceAdamSegment& s : options_.adam) {
      k.decay = s.decay && a.weight_decay != 0.0;
      cuda::AdamStep(ctx_, params_ + s.param, grads_ + s.grad, m_ + s.moment,
                     v_ + s.moment, s.count, k, grad_scale);
    }
    Mark(Profile::kPointwise);  // until the next step's first mark
    return Launched("adam step");
  }

  bool CollectivesIdentity(std::string* identity) override {
    if (!nccl_.Load()) return Fail(nccl_.error());
    cudaDeviceProp prop{};
    if (!Cuda(cudaGetDeviceProperties(&prop, options_.device),
              "cudaGetDeviceProperties"))
      return false;
    // The UUID: the same GPU seen from two containers is one.
    identity->assign(prop.uuid.bytes, sizeof prop.uuid.bytes);
    return true;
  }
  bool CollectivesId(std::string* id) override {
    return nccl_.UniqueId(id) || Fail(nccl_.error());
  }
  bool CollectivesJoin(const std::string& id, int rank, int world,
                       double timeout_s) override {
    nccl_world_ = world;
    return nccl_.Join(id, rank, world, timeout_s) || Fail(nccl_.error());
  }
  bool CollectivesWait() override {
    return nccl_.Ready() || Fail(nccl_.error());
  }
  void CollectivesLeave() override { nccl_.Abort(); }
  bool AllReduceGrads(float scale) override {
    Mark(Profile::kCollectives);
    if (!nccl_.AllReduceSum(grads_, grad_count_, ctx_.stream))
      return Fail(nccl_.error());
    Scale(ctx_, grads_, spec_.num_params, scale);
    return Launched("scale the gradients");
  }
  bool ReduceScatterGrads(size_t chunk, int rank, float scale) override {
    if (!Chunks(chunk, rank, grad_count_))
      return Fail("ReduceScatterGrads past the gradients");
    Mark(Profile::kCollectives);
    if (!nccl_.ReduceScatterSum(grads_, chunk, rank, ctx_.stream))
      return Fail(nccl_.error());
    Scale(ctx_, grads_ + rank * chunk, chunk, scale);
    return Launched("scale the gradients");
  }
  bool ScaleGrads(float scale) override {
    Scale(ctx_, grads_, grad_count_, scale);
    return Launched("scale the gradients");
  }
  bool GatherLayerParams(int layer, size_t owned_at, size_t chunk,
                         int rank) override {
    if (options_.windows != DeviceWindows::kParamsAndGrads ||
        !InWindow(layer, chunk, rank) || owned_at + chunk > param_count_)
      return Fail("GatherLayerParams outside its buffers");
    float* w = ParamWindow(layer);
    Mark(Profile::kCollectives);
    return Cuda(cudaMemcpyAsync(w + rank * chunk, params_ + owned_at,
                                chunk * sizeof(float), cudaMemcpyDeviceToDevice,
                                ctx_.stream),
                "copy a piece") &&
           (nccl_.AllGather(w, chunk, rank, ctx_.stream) ||
            Fail(nccl_.error()));
  }
  bool ReduceLayerGrads(int layer, size_t owned_at, size_t chunk,
                        int rank) override {
    if (options_.windows == DeviceWindows::kNone ||
        !InWindow(layer, chunk, rank) || owned_at + chunk > grad_count_)
      return Fail("ReduceLayerGrads outside its buffers");
    float* w = GradWindow(layer);
    Mark(Profile::kCollectives);
    if (!nccl_.ReduceScatterSum(w, chunk, rank, ctx_.stream))
      return Fail(nccl_.error());
    ResidualForward(ctx_, grads_ + owned_at, grads_ + owned_at,
                    w + rank * chunk, chunk);
    Zero(ctx_, w, WindowFloats(layer));
    return Launched("add a reduced piece");
  }
  bool GatherLayerPieces(int layer, size_t at, size_t count, size_t chunk,
                         int rank) override {
    if (options_.windows != DeviceWindows::kGrads ||
        !InWindow(layer, chunk, rank) || count > chunk ||
        at + count > param_count_)
      return Fail("GatherLayerPieces outside its buffers");
    // The gradient window serves: the pass is over.
    float* w = GradWindow(layer);
    Mark(Profile::kCollectives);
    Zero(ctx_, w + rank * chunk, chunk);
    if (!Cuda(cudaMemcpyAsync(w + rank * chunk, params_ + at,
                              count * sizeof(float), cudaMemcpyDeviceToDevice,
                              ctx_.stream),
              "copy a piece") ||
        !(nccl_.AllGather(w, chunk, rank, ctx_.stream) || Fail(nccl_.error())))
      return false;
    const bool ok = Cuda(cudaMemcpyAsync(params_ + LayerBegin(layer), w,
                                         LayerSize(layer) * sizeof(float),
                                         cudaMemcpyDeviceToDevice, ctx_.stream),
                         "copy a layer");
    Zero(ctx_, w, WindowFloats(layer));
    return ok && Launched("gather a layer");
  }

  bool AllGatherParams(size_t chunk, int rank) override {
    if (!Chunks(chunk, rank, param_count_))
      return Fail("AllGatherParams past the parameters");
    Mark(Profile::kCollectives);
    return nccl_.AllGather(params_, chunk, rank, ctx_.stream) ||
           Fail(nccl_.error());
  }

  bool PinHost(void* p, size_t bytes) override {
    if (p == nullptr || bytes == 0) return true;
    const cudaError_t e = cudaHostRegister(p, bytes, cudaHostRegisterDefault);
    if (e != cudaSuccess) {
      cudaGetLastError();  // clear it: pageable memory works, slower
      // A small buffer sharing a page with one pinned before: that page is
      // locked already, and the buffer's copies are too small to matter.
      return e == cudaErrorHostMemoryAlreadyRegistered;
    }
    pinned_.push_back(p);
    return true;
  }

  int64_t peak_memory_bytes() const override { return peak_bytes_; }
  int64_t state_bytes() const override {
    return 4 * static_cast<int64_t>(param_count_ + grad_count_ +
                                    2 * moments_count_);
  }

 private:
  // With rounded_acts_ the LayerNorms' outputs are only in ln1_16 and
  // ln2_16 (ln1 and ln2 null) and attention's also in atty16; else those
  // are null.
  struct Layer {
    float *ln1, *ln1_mean, *ln1_rstd, *qkv, *atty, *lse, *res2, *ln2, *ln2_mean,
        *ln2_rstd, *fch, *res3;
    void *ln1_16, *ln2_16, *atty16;
  };

  const char* PrecisionName() const {
    switch (options_.precision) {
      case DevicePrecision::kFp32:
        return "fp32";
      case DevicePrecision::kTf32:
        return "tf32";
      case DevicePrecision::kBf16:
        return "bf16";
      case DevicePrecision::kFp16:
        return "fp16";
    }
    return "?";
  }

  // The 16-bit modes: the products' operands rounded into ctx_.operand_a/b.
  bool Rounded() const { return ctx_.operands != CUDA_R_32F; }
  // An activation as a product reads it: its rounded copy where there is
  // one, else fp32.
  static Operand In(const float* fp32, const void* rounded) {
    return rounded != nullptr ? Operand::Rounded(rounded) : Operand(fp32);
  }

  bool Fail(const std::string& what) {
    error_ = what;
    return false;
  }
  bool Cuda(cudaError_t e, const char* what) {
    if (e == cudaSuccess) return true;
    return Fail(std::string(what) + ": " + cudaGetErrorString(e));
  }
  bool Blas(cublasStatus_t s, const char* what) {
    if (s == CUBLAS_STATUS_SUCCESS) return true;
    return Fail(std::string(what) + ": " + cublasGetStatusString(s));
  }
  bool Launched(const char* what) { return Cuda(cudaGetLastError(), what); }
  void Mark(Profile::Part part) { profile_.Mark(ctx_.stream, part); }
  bool Sync(const char* what) {
    const bool ok =
        Cuda(cudaStreamSynchronize(ctx_.stream), what) && Launched(what);
    if (ok) profile_.Collect();
    return ok;
  }

  template <typename X>
  bool Alloc(X** p, size_t n) {
    void* raw = nullptr;
    const cudaError_t e = cudaMalloc(&raw, n * sizeof(X));
    if (e != cudaSuccess) {
      cudaGetLastError();  // clear it
      char text[160];
      std::snprintf(text, sizeof text,
                    "cudaMalloc of %.2f GiB (%.2f GiB held): ",
                    static_cast<double>(n * sizeof(X)) / (1 << 30),
                    static_cast<double>(allocated_bytes_) / (1 << 30));
      return Fail(text + std::string(cudaGetErrorString(e)));
    }
    allocations_.emplace_back(raw, static_cast<int64_t>(n * sizeof(X)));
    allocated_bytes_ += allocations_.back().second;
    peak_bytes_ = std::max(peak_bytes_, allocated_bytes_);
    *p = static_cast<X*>(raw);
    return true;
  }
  // n zeroed floats, or null for none.
  bool AllocZero(float** p, size_t n) {
    *p = nullptr;
    if (n == 0) return true;
    if (!Alloc(p, n)) return false;
    Zero(ctx_, *p, n);
    return true;
  }
  void Free(void* p) {
    if (p == nullptr) return;
    cudaFree(p);
    for (auto it = allocations_.begin(); it != allocations_.end(); ++it) {
      if (it->first != p) continue;
      allocated_bytes_ -= it->second;
      allocations_.erase(it);
      break;
    }
  }

  // On the engine's stream (a plain cudaMemcpy runs on the legacy stream,
  // which does not order against a non-blocking one), finished on return.
  bool Up(float* dst, const float* host, size_t n) {
    return Cuda(cudaMemcpyAsync(dst, host, n * sizeof(float),
                                cudaMemcpyHostToDevice, ctx_.stream),
                "copy to the GPU") &&
           Sync("copy to the GPU");
  }
  bool Down(float* host, const float* src, size_t n) {
    return Cuda(cudaMemcpyAsync(host, src, n * sizeof(float),
                                cudaMemcpyDeviceToHost, ctx_.stream),
                "copy from the GPU") &&
           Sync("copy from the GPU");
  }

  // Instance l of kind k: in the whole buffers, or in the window of the
  // hook layer that owns it.
  float* P(Kind k, int l = 0) {
    if (options_.windows != DeviceWindows::kParamsAndGrads)
      return params_ + Offset(k, l);
    const int h = HookLayer(k, l);
    return ParamWindow(h) + (Offset(k, l) - LayerBegin(h));
  }
  float* G(Kind k, int l = 0) {
    if (options_.windows == DeviceWindows::kNone) return grads_ + Offset(k, l);
    const int h = HookLayer(k, l);
    return GradWindow(h) + (Offset(k, l) - LayerBegin(h));
  }
  size_t Offset(Kind k, int l) const {
    return spec_.offset[k] + static_cast<size_t>(l) * spec_.stride[k];
  }
  int HookLayer(Kind k, int l) const { return DeviceHookLayer(spec_, k, l); }
  bool IsLayer(int h) const { return h >= -1 && h <= spec_.num_layers; }
  // Every rank's chunk of `chunk` floats, and the layer's range, in its
  // windows.
  bool InWindow(int h, size_t chunk, int rank) const {
    return IsLayer(h) && rank >= 0 && rank < nccl_world_ &&
           static_cast<size_t>(nccl_world_) * chunk <= WindowFloats(h) &&
           LayerSize(h) <= WindowFloats(h);
  }
  // Every rank's chunk in a buffer of n floats.
  bool Chunks(size_t chunk, int rank, size_t n) const {
    return rank >= 0 && rank < nccl_world_ &&
           static_cast<size_t>(nccl_world_) * chunk <= n;
  }
  size_t LayerBegin(int h) const { return spec_.layer_begin[h + 1]; }
  size_t LayerSize(int h) const {
    return spec_.layer_begin[h + 2] - spec_.layer_begin[h + 1];
  }
  float* ParamWindow(int h) { return param_window_[h == -1 ? 0 : 1]; }
  float* GradWindow(int h) { return grad_window_[h == -1 ? 0 : 1]; }
  // The embedding's window (h -1) or the one every other layer takes.
  size_t WindowFloats(int h) const { return window_floats_[h == -1 ? 0 : 1]; }
  // The host's options make sense for this model (device_engine.h).
  bool CheckOptions() {
    const std::string why = CheckDeviceOptions(options_);
    return why.empty() || Fail("engine options: " + why);
  }

  // Calls a layer hook; false stops the pass. error() is then what a copy
  // inside the hook failed with, or the hook's failing (the host knows why).
  template <typename Fn>
  bool Hook(Fn hook, int layer, const char* what) {
    if (options_.windows == DeviceWindows::kNone) return true;
    Mark(Profile::kHost);
    error_.clear();
    if ((options_.hooks->*hook)(layer)) return true;
    if (error_.empty()) {
      error_ = std::string("the host's hook ") + what + " layer " +
               std::to_string(layer) + " failed";
    }
    return false;
  }
  bool BeforeForwardHook(int l) {
    return Hook(&DeviceLayerHooks::BeforeForward, l, "before the forward of");
  }
  bool BeforeBackwardHook(int l) {
    return Hook(&DeviceLayerHooks::BeforeBackward, l, "before the backward of");
  }
  bool AfterBackwardHook(int l) {
    return Hook(&DeviceLayerHooks::AfterBackward, l, "after the backward of");
  }

  // Activations for B x T, grown (never shrunk) on demand; the buffers of
  // worker/model.cc's Acts plus the attention workspace and scratch.
  bool Resize(int B, int T) {
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
      if (!Alloc(&tokens_, 2 * BT) || !Alloc(&groups_, 3 * BT + 1))
        return false;
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

  // Points every activation buffer into base for B x T (null: only counts);
  // returns the floats used.
  size_t Carve(float* base, int B, int T) {
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
    encoded_ = take(BT * C);
    layers_.resize(spec_.num_layers);
    for (Layer& y : layers_) {
      y.ln1 = take32(BT * C);
      y.ln1_16 = take16(BT * C);
      y.ln1_mean = take(BT);
      y.ln1_rstd = take(BT);
      y.qkv = take(3 * BT * C);
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
    // GELU's rounded output: in scratch4_, which backward then overwrites
    // with GELU's gradient once the product has read it.
    gelu16_ = rounded_acts_ ? static_cast<void*>(scratch4_) : nullptr;
    scratch_ = take(BT * C);
    dres_ = take(BT * C);
    dbtc_ = take(BT * C);
    dqkv_ = take(3 * BT * C);
    d4_ = take(4 * BT * C);
    attn_ws_ = take(AttentionWorkspaceFloats(ctx_, B, T, C, NH));
    col_scratch_ = take(LayerNormScratchFloats(4 * C));
    return used;
  }

  // Tokens and targets to the device; for training also the tokens grouped
  // by value (the embedding's backward pass).
  bool Load(const int* tokens, const int* targets, int B, int T, bool groups) {
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
      host_groups_.insert(host_groups_.end(), positions.begin(),
                          positions.end());
      if (!Cuda(cudaMemcpyAsync(groups_, host_groups_.data(),
                                host_groups_.size() * sizeof(int),
                                cudaMemcpyHostToDevice, ctx_.stream),
                "copy token groups"))
        return false;
    }
    return Cuda(
        cudaMemcpyAsync(tokens_, host_tokens_.data(), 2 * n * sizeof(int),
                        cudaMemcpyHostToDevice, ctx_.stream),
        "copy tokens");
  }

  const float* BlockInput(int l) const {
    return l == 0 ? encoded_ : layers_[l - 1].res3;
  }

  bool Forward() {
    const int C = spec_.channels;
    if (!BeforeForwardHook(-1)) return false;
    Mark(Profile::kEmbedding);
    EncoderForward(ctx_, encoded_, tokens_, P(kWte), P(kWpe), B_, T_, C);
    for (int l = 0; l < spec_.num_layers; l++) {
      if (!BeforeForwardHook(l) || !BlockForward(l, BlockInput(l)))
        return false;
    }
    return Launched("forward");
  }

  bool BlockForward(int l, const float* res_in) {
    const int N = B_ * T_, C = spec_.channels;
    const size_t NC = static_cast<size_t>(N) * C;
    Layer& a = layers_[l];
    Mark(Profile::kLayerNorm);
    LayerNormForward(ctx_, a.ln1, a.ln1_mean, a.ln1_rstd, res_in, P(kLn1w, l),
                     P(kLn1b, l), N, C, a.ln1_16);
    Mark(Profile::kMatmul);
    if (!Blas(MatmulForward(ctx_, a.qkv, In(a.ln1, a.ln1_16), P(kQkvw, l),
                            P(kQkvb, l), N, C, 3 * C),
              "qkv"))
      return false;
    Mark(Profile::kAttention);
    if (!Blas(AttentionForward(ctx_, a.atty, a.lse, a.qkv, B_, T_, C,
                               spec_.num_heads, attn_ws_, a.atty16),
              "attention"))
      return false;
    Mark(Profile::kMatmul);
    if (!Blas(MatmulForward(ctx_, scratch_, In(a.atty, a.atty16),
                            P(kAttprojw, l), P(kAttprojb, l), N, C, C),
              "attproj"))
      return false;
    Mark(Profile::kLayerNorm);
    ResidualLayerNormForward(ctx_, a.res2, a.ln2, a.ln2_mean, a.ln2_rstd,
                             res_in, scratch_, P(kLn2w, l), P(kLn2b, l), N, C,
                             a.ln2_16);
    Mark(Profile::kMatmul);
    if (!Blas(MatmulForward(ctx_, a.fch, In(a.ln2, a.ln2_16), P(kFcw, l),
                            P(kFcb, l), N, C, 4 * C),
              "fc"))
      return false;
    Mark(Profile::kPointwise);
    GeluForward(ctx_, scratch4_, a.fch, 4 * NC, gelu16_);
    Mark(Profile::kMatmul);
    if (!Blas(MatmulForward(ctx_, scratch_, In(scratch4_, gelu16_),
                            P(kFcprojw, l), P(kFcprojb, l), N, 4 * C, C),
              "fcproj"))
      return false;
    Mark(Profile::kPointwise);
    ResidualForward(ctx_, a.res3, a.res2, scratch_, NC);
    return true;
  }

  // The final LayerNorm, the logits and the classifier; with backward the
  // logits' gradient for dloss per token, over the logits (fp32, tf32) or
  // rounded into ctx_.operand_a (16-bit modes).
  bool HeadForward(bool backward, float dloss) {
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

  bool Backward() {
    const int N = B_ * T_, C = spec_.channels;
    const int Vp = spec_.padded_vocab_size, L = spec_.num_layers;
    // The logits' gradient: over the logits, or rounded by the classifier.
    const Operand dlogits = In(logits_, Rounded() ? ctx_.operand_a : nullptr);
    if (!BeforeBackwardHook(L)) return false;
    Mark(Profile::kHead);
    if (!Blas(RowGemm(ctx_, false, false, N, C, Vp, 1.0f, dlogits, Vp, P(kWte),
                      C, 0.0f, dbtc_, C),
              "dlnf"))
      return false;
    if (!Blas(RowGemm(ctx_, true, false, Vp, C, N, 1.0f, dlogits, Vp,
                      In(lnf_, lnf16_), C, 1.0f, G(kWte), C),
              "dwte"))
      return false;
    Mark(Profile::kPointwise);
    Zero(ctx_, dres_, static_cast<size_t>(N) * C);
    Mark(Profile::kLayerNorm);
    cuda::LayerNormBackward(ctx_, dres_, G(kLnfw), G(kLnfb), dbtc_,
                            BlockInput(L), P(kLnfw), lnf_mean_, lnf_rstd_, N, C,
                            col_scratch_);
    if (!AfterBackwardHook(L)) return false;
    for (int l = L - 1; l >= 0; l--) {
      if (!BeforeBackwardHook(l) || !BlockBackward(l, BlockInput(l)) ||
          !AfterBackwardHook(l))
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

  // As worker/model.cc's BlockBackward: dres carries d(loss)/d(res3) in and
  // d(loss)/d(res_in) out. The products and GELU's and attention's backward
  // write their input gradients (no zeroing first); the LayerNorms add
  // theirs into dres.
  bool BlockBackward(int l, const float* res_in) {
    const int N = B_ * T_, C = spec_.channels;
    const size_t NC = static_cast<size_t>(N) * C;
    const Layer& a = layers_[l];
    Mark(Profile::kPointwise);
    GeluForward(ctx_, scratch4_, a.fch, 4 * NC, gelu16_);  // recomputed
    Mark(Profile::kMatmul);
    if (!Blas(MatmulBackward(ctx_, d4_, G(kFcprojw, l), G(kFcprojb, l), dres_,
                             In(scratch4_, gelu16_), P(kFcprojw, l), N, 4 * C,
                             C, col_scratch_, /*dinp_beta=*/0.0f),
              "fcproj backward"))
      return false;
    Mark(Profile::kPointwise);
    GeluBackward(ctx_, scratch4_, a.fch, d4_, 4 * NC, /*add=*/false);
    Mark(Profile::kMatmul);
    if (!Blas(MatmulBackward(ctx_, dbtc_, G(kFcw, l), G(kFcb, l), scratch4_,
                             In(a.ln2, a.ln2_16), P(kFcw, l), N, C, 4 * C,
                             col_scratch_, 0.0f),
              "fc backward"))
      return false;
    Mark(Profile::kLayerNorm);
    cuda::LayerNormBackward(ctx_, dres_, G(kLn2w, l), G(kLn2b, l), dbtc_,
                            a.res2, P(kLn2w, l), a.ln2_mean, a.ln2_rstd, N, C,
                            col_scratch_);
    Mark(Profile::kMatmul);
    if (!Blas(MatmulBackward(ctx_, dbtc_, G(kAttprojw, l), G(kAttprojb, l),
                             dres_, In(a.atty, a.atty16), P(kAttprojw, l), N, C,
                             C, col_scratch_, 0.0f),
              "attproj backward"))
      return false;
    Mark(Profile::kAttention);
    if (!Blas(AttentionBackward(ctx_, dqkv_, dbtc_, a.qkv, a.atty, a.lse, B_,
                                T_, C, spec_.num_heads, attn_ws_,
                                /*add=*/false),
              "attention backward"))
      return false;
    Mark(Profile::kMatmul);
    if (!Blas(MatmulBackward(ctx_, dbtc_, G(kQkvw, l), G(kQkvb, l), dqkv_,
                             In(a.ln1, a.ln1_16), P(kQkvw, l), N, C, 3 * C,
                             col_scratch_, 0.0f),
              "qkv backward"))
      return false;
    Mark(Profile::kLayerNorm);
    cuda::LayerNormBackward(ctx_, dres_, G(kLn1w, l), G(kLn1b, l), dbtc_,
                            res_in, P(kLn1w, l), a.ln1_mean, a.ln1_rstd, N, C,
                            col_scratch_);
    return true;
  }

  // The mean of this batch's losses, summed on the host in double (as the
  // CPU engine does).
  bool MeanLoss(float* loss) {
    const size_t n = static_cast<size_t>(B_) * T_;
    host_losses_.resize(n);
    if (!Cuda(cudaMemcpyAsync(host_losses_.data(), losses_, n * sizeof(float),
                              cudaMemcpyDeviceToHost, ctx_.stream),
              "copy losses") ||
        !Sync("step")) {
      return false;
    }
    double sum = 0;
    for (float x : host_losses_) sum += x;
    *loss = static_cast<float>(sum / static_cast<double>(n));
    return true;
  }

  DeviceEngineOptions options_;
  DeviceModelSpec spec_;
  Ctx ctx_;
  Profile profile_;
  std::string describe_, error_;
  std::vector<std::pair<void*, int64_t>> allocations_;  // with their bytes
  std::vector<void*> pinned_;  // host memory PinHost registered
  NcclComm nccl_;
  int nccl_world_ = 0;  // the ranks CollectivesJoin was given
  int64_t allocated_bytes_ = 0, peak_bytes_ = 0;
  // The buffers (floats in each): whole, or the owned pieces under windows.
  float *params_ = nullptr, *grads_ = nullptr, *m_ = nullptr, *v_ = nullptr;
  size_t param_count_ = 0, grad_count_ = 0, moments_count_ = 0;
  // Under windows: the embedding's [0] and every other layer's [1].
  float* param_window_[2] = {nullptr, nullptr};
  float* grad_window_[2] = {nullptr, nullptr};
  std::vector<cudaEvent_t> grad_copied_;  // by hook layer + 1
  size_t window_floats_[2] = {0, 0};      // their sizes
  bool windows_dirty_ = false;  // a pass under windows began, not ended
  double* partials_ = nullptr;
  int B_ = 0, T_ = 0;
  float* acts_ = nullptr;
  size_t acts_floats_ = 0;
  int *tokens_ = nullptr,
      *groups_ = nullptr;  // groups: tokens, offsets, positions
  size_t token_capacity_ = 0;
  int n_unique_ = 0;
  float *encoded_, *lnf_, *lnf_mean_, *lnf_rstd_, *logits_, *losses_,
      *scratch4_, *scratch_, *dres_, *dbtc_, *dqkv_, *d4_, *attn_ws_,
      *col_scratch_;
  // With rounded_acts_: the final LayerNorm's output (lnf_ then null) and
  // GELU's (in scratch4_), rounded; else null.
  void *lnf16_ = nullptr, *gelu16_ = nullptr;
  bool rounded_acts_ = false;  // activations kept rounded (16-bit modes)
  std::vector<Layer> layers_;
  std::vector<int> host_tokens_, host_groups_;
  std::vector<uint64_t> keys_;
  std::vector<float> host_losses_;
};

}  // namespace
}  // namespace dslaunch::worker::cuda

extern "C" dslaunch::worker::DeviceEngine* dsl_cuda_create_engine(
    const dslaunch::worker::DeviceEngineOptions* options, std::string* error) {
  auto engine = std::make_unique<dslaunch::worker::cuda::CudaEngine>(*options);
  if (!engine->Init()) {
    *error = engine->error();
    return nullptr;
  }
  return engine.release();
}

extern "C" int dsl_cuda_abi_version() {
  return dslaunch::worker::kDeviceEngineAbi;
}

extern "C" int dsl_cuda_device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return n;
}
