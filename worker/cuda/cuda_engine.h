// CudaEngine: worker/device_engine.h's DeviceEngine on one CUDA GPU. The
// GPT-2 forward and backward pass of worker/model.cc, step for step, over
// device buffers with worker/cuda/kernels_cuda.h; AdamW and the gradient
// norm on the device. Built into libdsl_cuda.so, which dsworker opens with
// dlopen (worker/device_loader.cc) only for --device cuda or auto. Its
// parts: cuda_engine.cu (the device, its buffers and copies, the optimizer
// step), cuda_passes.cu (the activations and the passes over them),
// cuda_collectives.cu (the collectives among the ranks' GPUs).
#pragma once

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
  ~CudaEngine() override;
  bool Init();

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
  bool GetParamsRange(size_t begin, size_t count, float* host) override {
    return begin <= param_count_ && count <= param_count_ - begin
               ? Down(host, params_ + begin, count)
               : Fail("GetParamsRange past the parameters");
  }
  bool SetGradsRange(size_t begin, size_t count, const float* host) override {
    return begin <= grad_count_ && count <= grad_count_ - begin
               ? Up(grads_ + begin, host, count)
               : Fail("SetGradsRange past the gradients");
  }
  bool GetGradsRange(size_t begin, size_t count, float* host) override {
    return begin <= grad_count_ && count <= grad_count_ - begin
               ? Down(host, grads_ + begin, count)
               : Fail("GetGradsRange past the gradients");
  }
  bool StartSetParams(size_t begin, size_t count, const float* host) override;
  bool WaitSetParams() override { return Sync("copy parameters to the GPU"); }
  bool SetLayerParams(int layer, const float* host) override;
  bool TakeLayerGrads(int layer, float* host) override;
  bool WaitLayerGrads(int layer) override;
  bool ZeroGrad() override;
  bool TrainMicroBatch(const int* tokens, const int* targets, int B, int T,
                       float grad_scale, float* loss) override;
  bool EvalBatch(const int* tokens, const int* targets, int B, int T,
                 float* loss) override;
  bool GradSquaredSum(size_t begin, size_t count, double* out) override;
  bool AdamStep(const DeviceAdam& a, float grad_scale) override;
  bool CollectivesIdentity(std::string* identity) override;
  bool CollectivesId(std::string* id) override;
  bool CollectivesJoin(const std::string& id, int rank, int world,
                       double timeout_s) override;
  bool CollectivesWait() override;
  void CollectivesLeave() override { nccl_.Abort(); }
  bool AllReduceGrads(float scale) override;
  bool ReduceScatterGrads(size_t chunk, int rank, float scale) override;
  bool ScaleGrads(float scale) override;
  bool GatherLayerParams(int layer, size_t owned_at, size_t chunk,
                         int rank) override;
  bool ReduceLayerGrads(int layer, size_t owned_at, size_t chunk,
                        int rank) override;
  bool GatherLayerPieces(int layer, size_t at, size_t count, size_t chunk,
                         int rank) override;
  bool AllGatherParams(size_t chunk, int rank) override;
  bool AllocateOwned(size_t count) override;
  bool PinHost(void* p, size_t bytes) override;

  int64_t peak_memory_bytes() const override { return peak_bytes_; }
  int64_t state_bytes() const override {
    return 4 * static_cast<int64_t>(param_count_ + grad_count_ +
                                    2 * moments_count_);
  }

 private:
  // With rounded_acts_ the LayerNorms' outputs are only in ln1_16 and
  // ln2_16 (ln1 and ln2 null) and attention's also in atty16; else those
  // are null. With the fused attention qkv is only in qkv16 (bf16, what the
  // fused kernels read; qkv null), else only in qkv (qkv16 null).
  struct Layer {
    float *ln1, *ln1_mean, *ln1_rstd, *qkv, *atty, *lse, *res2, *ln2, *ln2_mean,
        *ln2_rstd, *fch, *res3;
    void *ln1_16, *ln2_16, *atty16, *qkv16;
  };

  const char* PrecisionName() const;

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
  bool Sync(const char* what);

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
  bool AllocZero(float** p, size_t n);
  void Free(void* p);

  // On the engine's stream (a plain cudaMemcpy runs on the legacy stream,
  // which does not order against a non-blocking one), finished on return.
  bool Up(float* dst, const float* host, size_t n);
  template <typename X>
  bool Down(X* host, const X* src, size_t n) {
    return Cuda(cudaMemcpyAsync(host, src, n * sizeof(X),
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
  // Hook layer h's window: the embedding's (0), or one of the two the other
  // layers take by turns (1 even, 2 odd), so that one layer's copy runs
  // while its neighbour computes.
  static int WindowIndex(int h) { return h == -1 ? 0 : 1 + (h & 1); }
  float* ParamWindow(int h) { return param_window_[WindowIndex(h)]; }
  float* GradWindow(int h) { return grad_window_[WindowIndex(h)]; }
  // The floats of h's window: the embedding's, or the other layers' most.
  size_t WindowFloats(int h) const { return window_floats_[h == -1 ? 0 : 1]; }
  // Before the device writes hook layer h's gradient window: waits (on the
  // device) until its last copy to the host has zeroed it.
  bool WritesGradWindow(int h);
  // What a copy into parameter window w waits for, into *after: the
  // device's work that reads what it holds (see SetLayerParams).
  bool ParamWindowFree(int w, cudaEvent_t* after);
  // At a pass's start: the block windows' last readers are all queued.
  bool ParamWindowsIdle();
  // A copy stream of the engine's own (not the compute stream).
  bool OwnStream(cudaStream_t s) const {
    return s != nullptr && s != ctx_.stream;
  }
  // The host's options make sense for this model (device_engine.h).
  bool CheckOptions();

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
  bool Resize(int B, int T);

  // Points every activation buffer into base for B x T (null: only counts);
  // returns the floats used.
  size_t Carve(float* base, int B, int T);

  // Tokens and targets to the device; for training also the tokens grouped
  // by value (the embedding's backward pass).
  bool Load(const int* tokens, const int* targets, int B, int T, bool groups);

  const float* BlockInput(int l) const {
    return l == 0 ? encoded_ : layers_[l - 1].res3;
  }

  bool Forward();
  bool BlockForward(int l, const float* res_in);
  // Layer l's linear layer of weight kind `weight` (its bias the kind
  // after): out (N, out_width) = inp (N, in) W^T + b; backward writes dinp
  // and adds into the weight's and (unless the caller has) the bias's
  // gradients.
  static Kind BiasOf(Kind weight) { return static_cast<Kind>(weight + 1); }
  bool Linear(int l, Kind weight, float* out, Operand inp, int in,
              int out_width, const char* what, void* out_bf16 = nullptr);
  bool LinearBackward(int l, Kind weight, float* dinp, Operand dout,
                      Operand inp, int in, int out_width, const char* what,
                      bool bias = true);

  // The final LayerNorm, the logits and the classifier; with backward the
  // logits' gradient for dloss per token, over the logits (fp32, tf32) or
  // rounded into ctx_.operand_a (16-bit modes).
  bool HeadForward(bool backward, float dloss);
  bool Backward();

  // As worker/model.cc's BlockBackward: dres carries d(loss)/d(res3) in and
  // d(loss)/d(res_in) out. The products and GELU's and attention's backward
  // write their input gradients (no zeroing first); the LayerNorms add
  // theirs into dres.
  bool BlockBackward(int l, const float* res_in);

  // The mean of this batch's losses, summed on the host in double (as the
  // CPU engine does).
  bool MeanLoss(float* loss);

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
  // Under windows, by WindowIndex: the embedding's and the other layers'
  // two.
  float* param_window_[3] = {nullptr, nullptr, nullptr};
  float* grad_window_[3] = {nullptr, nullptr, nullptr};
  size_t window_floats_[2] = {0, 0};  // the embedding's, the others'
  // The windows' copies to and from the host run on streams of their own,
  // one for the parameters and one for the gradients (so that neither
  // waits behind the other), or on the compute stream itself with
  // DSL_CUDA_COPY_STREAM=0; ordered against the compute stream by events,
  // by WindowIndex:
  //  grad_copied_ (by hook layer + 1): a layer's gradients reached the host;
  //  grads_done_: the compute stream wrote the window (the copy waits);
  //  grad_free_: the copy stream zeroed it after the copy (the next writer
  //    waits);
  //  param_ready_: a copy into the parameter window landed (the compute
  //    stream and the host wait);
  //  param_free_: the compute stream's readers of the window's last
  //    contents were all queued before it (a copy into it waits), valid
  //    where param_free_valid_;
  //  launched_: everything queued on the compute stream so far.
  cudaStream_t param_stream_ = nullptr, grad_stream_ = nullptr;
  std::vector<cudaEvent_t> grad_copied_;
  cudaEvent_t grads_done_[3] = {}, grad_free_[3] = {}, param_ready_[3] = {},
              param_free_[3] = {}, launched_ = nullptr;
  bool param_free_valid_[3] = {false, false, false};
  int last_block_window_ = -1;  // the block window filled last in the pass
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

}  // namespace dslaunch::worker::cuda
