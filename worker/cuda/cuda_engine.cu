// CudaEngine (cuda_engine.h): the device, its buffers and the copies to and
// from the host, the optimizer step and the gradient norm.
#include "worker/cuda/cuda_engine.h"

namespace dslaunch::worker::cuda {

CudaEngine::~CudaEngine() {
  if (ctx_.stream != nullptr) cudaStreamSynchronize(ctx_.stream);
  for (cudaStream_t s : {param_stream_, grad_stream_})
    if (OwnStream(s)) cudaStreamSynchronize(s);
  nccl_.Close();  // before the buffers and the stream go
  profile_.Collect();
  profile_.Print();
  for (cudaEvent_t e : grad_copied_)
    if (e != nullptr) cudaEventDestroy(e);
  for (cudaEvent_t* set : {grads_done_, grad_free_, param_ready_, param_free_})
    for (int w = 0; w < 3; ++w)
      if (set[w] != nullptr) cudaEventDestroy(set[w]);
  if (launched_ != nullptr) cudaEventDestroy(launched_);
  for (cudaStream_t s : {param_stream_, grad_stream_})
    if (OwnStream(s)) cudaStreamDestroy(s);
  for (void* p : pinned_) cudaHostUnregister(p);
  for (const auto& a : allocations_) cudaFree(a.first);
  LtDestroy(ctx_.lt);
  if (ctx_.blas != nullptr) cublasDestroy(ctx_.blas);
  if (ctx_.stream != nullptr) cudaStreamDestroy(ctx_.stream);
}

bool CudaEngine::Init() {
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
  // cuBLASLt for the products with a bias, unless DSL_CUDA_LT=0 (null: the
  // biases written before the products).
  const char* lt_env = std::getenv("DSL_CUDA_LT");
  const std::string lt_mode = lt_env != nullptr ? lt_env : "";
  if (!lt_mode.empty() && lt_mode != "0" && lt_mode != "1")
    return Fail("DSL_CUDA_LT=" + lt_mode + ": not 0 or 1");
  if (lt_mode != "0") ctx_.lt = LtCreate();
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
      ctx_.operands = options_.precision == DevicePrecision::kBf16 ? CUDA_R_16BF
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
  if (!AllocZero(&params_, param_count_) || !AllocZero(&grads_, grad_count_) ||
      !AllocZero(&m_, moments_count_) || !AllocZero(&v_, moments_count_) ||
      !Alloc(&partials_, kSquaredSumBlocks)) {
    return false;
  }
  if (windows) {
    // One window for the embedding (it stays from the head's backward to
    // its own) and two the other layers take by turns, each at least what
    // the host asks (for collectives on them).
    window_floats_[0] = std::max(LayerSize(-1), options_.window_floats[0]);
    window_floats_[1] = options_.window_floats[1];
    for (int l = 0; l <= spec_.num_layers; ++l)
      window_floats_[1] = std::max(window_floats_[1], LayerSize(l));
    const bool params = options_.windows == DeviceWindows::kParamsAndGrads;
    for (int w = 0; w < 3; ++w) {
      const size_t floats = window_floats_[w == 0 ? 0 : 1];
      if (!AllocZero(&grad_window_[w], floats) ||
          (params && !AllocZero(&param_window_[w], floats)))
        return false;
    }
    const char* copies = std::getenv("DSL_CUDA_COPY_STREAM");
    const std::string copy_mode = copies != nullptr ? copies : "";
    if (copy_mode == "0") {
      // The copies in line with the compute.
      param_stream_ = grad_stream_ = ctx_.stream;
    } else if (!copy_mode.empty() && copy_mode != "1") {
      return Fail("DSL_CUDA_COPY_STREAM=" + copy_mode + ": not 0 or 1");
    } else {
      for (cudaStream_t* s : {&param_stream_, &grad_stream_}) {
        if (!Cuda(cudaStreamCreateWithFlags(s, cudaStreamNonBlocking),
                  "cudaStreamCreate"))
          return false;
      }
    }
    grad_copied_.assign(spec_.num_layers + 2, nullptr);
    std::vector<cudaEvent_t*> events{&launched_};
    for (cudaEvent_t& e : grad_copied_) events.push_back(&e);
    for (cudaEvent_t* set :
         {grads_done_, grad_free_, param_ready_, param_free_})
      for (int w = 0; w < 3; ++w) events.push_back(&set[w]);
    for (cudaEvent_t* e : events) {
      if (!Cuda(cudaEventCreateWithFlags(e, cudaEventDisableTiming),
                "cudaEventCreate"))
        return false;
    }
  }
  return Sync("init");
}

bool CudaEngine::StartSetParams(size_t begin, size_t count, const float* host) {
  if (begin > param_count_ || count > param_count_ - begin)
    return Fail("StartSetParams past the parameters");
  if (Cuda(cudaMemcpyAsync(params_ + begin, host, count * sizeof(float),
                           cudaMemcpyHostToDevice, ctx_.stream),
           "copy parameters to the GPU"))
    return true;
  cudaStreamSynchronize(ctx_.stream);  // no copy left running
  return false;
}

// A block window's readers are the kernels of the layer it was filled for,
// all queued by the time the other block window is filled for the next
// layer: that moment (param_free_) is what a copy into it waits for, not
// the work queued since (the next layer, which the copy then overlaps).
// The same window filled twice in a row (the last layer's, before and
// after the head) and the embedding's (once a pass, on an idle device)
// wait for everything queued. A pass starts with both block windows'
// events recorded (ParamWindowsIdle): their last readers were the last
// pass's.
bool CudaEngine::ParamWindowFree(int w, cudaEvent_t* after) {
  const bool everything =
      w == 0 || last_block_window_ == w || !param_free_valid_[w];
  if (w != 0) {
    const int other = w == 1 ? 2 : 1;
    if (last_block_window_ == other) {
      param_free_valid_[other] = false;
      if (!Cuda(cudaEventRecord(param_free_[other], ctx_.stream),
                "cudaEventRecord"))
        return false;
      param_free_valid_[other] = true;
    }
    last_block_window_ = w;
  }
  *after = param_free_[w];
  if (!everything) return true;
  *after = launched_;
  return Cuda(cudaEventRecord(launched_, ctx_.stream), "cudaEventRecord");
}

bool CudaEngine::ParamWindowsIdle() {
  last_block_window_ = -1;
  for (int w : {1, 2}) {
    param_free_valid_[w] = false;
    if (options_.windows != DeviceWindows::kParamsAndGrads) continue;
    if (!Cuda(cudaEventRecord(param_free_[w], ctx_.stream), "cudaEventRecord"))
      return false;
    param_free_valid_[w] = true;
  }
  return true;
}

bool CudaEngine::WritesGradWindow(int h) {
  if (grad_stream_ == ctx_.stream || options_.windows == DeviceWindows::kNone)
    return true;
  return Cuda(cudaStreamWaitEvent(ctx_.stream, grad_free_[WindowIndex(h)], 0),
              "cudaStreamWaitEvent");
}

bool CudaEngine::SetLayerParams(int layer, const float* host) {
  if (options_.windows != DeviceWindows::kParamsAndGrads || !IsLayer(layer))
    return Fail("SetLayerParams without parameter windows");
  // On the parameter stream once the window's readers are done, while the
  // compute stream goes on with the layer before (the gradient copies have
  // a stream of their own: this one waits behind none of them); the
  // compute stream waits for it, and the host (whose buffer it reads) too.
  const int w = WindowIndex(layer);
  cudaEvent_t after = nullptr;
  if (!ParamWindowFree(w, &after) ||
      !Cuda(cudaStreamWaitEvent(param_stream_, after, 0),
            "cudaStreamWaitEvent"))
    return false;
  if (Cuda(cudaMemcpyAsync(ParamWindow(layer), host,
                           LayerSize(layer) * sizeof(float),
                           cudaMemcpyHostToDevice, param_stream_),
           "copy a layer's parameters to the GPU") &&
      Cuda(cudaEventRecord(param_ready_[w], param_stream_),
           "cudaEventRecord") &&
      Cuda(cudaEventSynchronize(param_ready_[w]),
           "copy a layer's parameters to the GPU"))
    return Cuda(cudaStreamWaitEvent(ctx_.stream, param_ready_[w], 0),
                "cudaStreamWaitEvent");
  cudaStreamSynchronize(param_stream_);  // done with the host's buffer
  return false;
}

bool CudaEngine::TakeLayerGrads(int layer, float* host) {
  if (options_.windows == DeviceWindows::kNone || !IsLayer(layer))
    return Fail("TakeLayerGrads without gradient windows");
  // On the copy stream after the layer's backward, while the compute stream
  // goes on with the layer before (whose window is the other one); zeroed
  // there after the copy, which the window's next writer waits for.
  const int w = WindowIndex(layer);
  float* window = GradWindow(layer);
  const size_t bytes = LayerSize(layer) * sizeof(float);
  if (Cuda(cudaEventRecord(grads_done_[w], ctx_.stream), "cudaEventRecord") &&
      Cuda(cudaStreamWaitEvent(grad_stream_, grads_done_[w], 0),
           "cudaStreamWaitEvent") &&
      Cuda(cudaMemcpyAsync(host, window, bytes, cudaMemcpyDeviceToHost,
                           grad_stream_),
           "copy a gradient window from the GPU") &&
      Cuda(cudaEventRecord(grad_copied_[layer + 1], grad_stream_),
           "cudaEventRecord") &&
      Cuda(cudaMemsetAsync(window, 0, bytes, grad_stream_),
           "zero a gradient window") &&
      Cuda(cudaEventRecord(grad_free_[w], grad_stream_), "cudaEventRecord"))
    return true;
  cudaStreamSynchronize(grad_stream_);  // no copy left running
  return false;
}

bool CudaEngine::WaitLayerGrads(int layer) {
  if (options_.windows == DeviceWindows::kNone || !IsLayer(layer))
    return Fail("WaitLayerGrads without gradient windows");
  return Cuda(cudaEventSynchronize(grad_copied_[layer + 1]),
              "copy a gradient window from the GPU");
}

bool CudaEngine::ZeroGrad() {
  profile_.StepDone();  // a step starts
  if (grad_count_ > 0) Zero(ctx_, grads_, grad_count_);
  return Launched("zero grad");
}

bool CudaEngine::GradSquaredSum(size_t begin, size_t count, double* out) {
  if (begin > grad_count_ || count > grad_count_ - begin)
    return Fail("GradSquaredSum past the gradients");
  Mark(Profile::kOptimizer);
  SquaredSumPartials(ctx_, grads_ + begin, count, partials_);
  double host[kSquaredSumBlocks];
  if (!Down(host, partials_, kSquaredSumBlocks)) return false;
  double sum = 0;
  for (double x : host) sum += x;
  *out = sum;
  return true;
}

bool CudaEngine::AdamStep(const DeviceAdam& a, float grad_scale) {
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

bool CudaEngine::PinHost(void* p, size_t bytes) {
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

const char* CudaEngine::PrecisionName() const {
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

bool CudaEngine::Sync(const char* what) {
  const bool ok =
      Cuda(cudaStreamSynchronize(ctx_.stream), what) && Launched(what);
  if (ok) profile_.Collect();
  return ok;
}

bool CudaEngine::AllocZero(float** p, size_t n) {
  *p = nullptr;
  if (n == 0) return true;
  if (!Alloc(p, n)) return false;
  Zero(ctx_, *p, n);
  return true;
}

void CudaEngine::Free(void* p) {
  if (p == nullptr) return;
  cudaFree(p);
  for (auto it = allocations_.begin(); it != allocations_.end(); ++it) {
    if (it->first != p) continue;
    allocated_bytes_ -= it->second;
    allocations_.erase(it);
    break;
  }
}

bool CudaEngine::Up(float* dst, const float* host, size_t n) {
  return Cuda(cudaMemcpyAsync(dst, host, n * sizeof(float),
                              cudaMemcpyHostToDevice, ctx_.stream),
              "copy to the GPU") &&
         Sync("copy to the GPU");
}

bool CudaEngine::CheckOptions() {
  const std::string why = CheckDeviceOptions(options_);
  return why.empty() || Fail("engine options: " + why);
}

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
