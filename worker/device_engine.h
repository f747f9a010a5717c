// DeviceEngine: one rank's GPT-2 model, its gradients and its AdamW state on
// an accelerator. The CUDA one lives in its own shared object,
// libdsl_cuda.so (worker/cuda/), which dsworker opens only when a run asks
// for the GPU: the CPU binary needs no CUDA library at run time.
//
// The interface carries only plain C++ types (no Status, no CUDA types), so
// the shared object is built from worker/cuda/ and this header alone. Every
// method that can fail returns false and leaves the reason in error().
// Host buffers are whole flat parameter vectors in llm.c's order (kLlmc),
// num_params floats; the engine keeps the same layout on the device.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace dslaunch::worker {

// The interface's version, raised with every change to this header:
// dsworker opens only a libdsl_cuda.so that says the same (one from
// another build could read past a buffer of another size).
// 2: moments_begin/moments_count.
constexpr int kDeviceEngineAbi = 2;

// How the matrix products compute; activations, parameters, gradients and
// optimizer state are fp32 in every mode.
enum class DevicePrecision {
  kFp32,  // exact fp32 products (the mode that equals the CPU engine)
  kTf32,  // tensor cores on tf32 (10-bit mantissa) inputs, fp32 sums
  kBf16,  // tensor cores on bf16 inputs, fp32 sums (bf16.enabled)
  kFp16,  // tensor cores on fp16 inputs, fp32 sums (fp16.enabled: the
          // trainer scales the loss; overflows show as a non-finite norm)
};

// The model's shape and where each parameter kind's layer-0 instance starts
// in the flat buffer (instance l of a per-layer kind follows at
// offset + l * its size), as worker/param_layout.h computes them.
struct DeviceModelSpec {
  int max_seq_len = 0, vocab_size = 0, padded_vocab_size = 0;
  int num_layers = 0, num_heads = 0, channels = 0;
  size_t num_params = 0;
  size_t offset[16] = {};  // by ParamKind
  // [begin, end) ranges of the flat buffer and whether AdamW decays them.
  struct Segment {
    size_t begin, end;
    bool decay;
  };
  std::vector<Segment> segments;
};

struct DeviceEngineOptions {
  DeviceModelSpec model;
  int device = 0;  // CUDA ordinal within CUDA_VISIBLE_DEVICES
  DevicePrecision precision = DevicePrecision::kFp32;
  // The part of the flat buffer whose AdamW moments live on the device and
  // which AdamStep updates: everything by default; a rank's shard under
  // ZeRO stage 1 or 2; nothing (count 0) when the optimizer is offloaded to
  // the CPU. Cut at num_params.
  size_t moments_begin = 0;
  size_t moments_count = static_cast<size_t>(-1);
};

// One AdamW (or Adam with L2) step's constants, as worker/cpu_adam.h's
// AdamParams (doubles; the engine rounds them to fp32 the same way).
struct DeviceAdam {
  double lr, beta1, beta2, eps, weight_decay;
  bool adamw_mode;
  int64_t step;
};

class DeviceEngine {
 public:
  virtual ~DeviceEngine() = default;
  // "NVIDIA H100 80GB HBM3, sm_90, 79.1 GiB, bf16".
  virtual std::string Describe() const = 0;
  virtual const std::string& error() const = 0;

  // Whole buffers of num_params floats, host <-> device.
  virtual bool SetParams(const float* host) = 0;
  virtual bool GetParams(float* host) = 0;
  virtual bool SetGrads(const float* host) = 0;
  virtual bool GetGrads(float* host) = 0;
  // The moments of the device's part (moments_count floats each).
  virtual bool SetMoments(const float* m, const float* v) = 0;
  virtual bool GetMoments(float* m, float* v) = 0;

  virtual bool ZeroGrad() = 0;
  // Forward and backward over B x T tokens (row-major), adding the gradient
  // of grad_scale * (mean loss) into the gradients. *loss: the mean
  // cross-entropy of this micro-batch. REQUIRES: every token and target in
  // [0, vocab_size), 1 <= T <= max_seq_len.
  virtual bool TrainMicroBatch(const int* tokens, const int* targets, int B,
                               int T, float grad_scale, float* loss) = 0;
  // Forward only: the mean loss.
  virtual bool EvalBatch(const int* tokens, const int* targets, int B, int T,
                         float* loss) = 0;
  // Sum of the squared gradients of the first num_params floats, in double.
  virtual bool GradSquaredSum(double* out) = 0;
  // grads *= grad_scale, then one AdamW step over every segment, within
  // the device's part of the buffer (nothing where that part is empty: a
  // rank whose shard is all padding, or an offloaded optimizer).
  virtual bool AdamStep(const DeviceAdam& adam, float grad_scale) = 0;

  // Peak bytes this engine has had allocated on the device.
  virtual int64_t peak_memory_bytes() const = 0;
  // Parameters, gradients and the device's moments, in bytes.
  virtual int64_t state_bytes() const = 0;
};

}  // namespace dslaunch::worker

// The shared object's one entry point (dlsym'd by name): a new engine, or
// null with the reason in *error (no device, out of memory, ...).
extern "C" dslaunch::worker::DeviceEngine* dsl_cuda_create_engine(
    const dslaunch::worker::DeviceEngineOptions* options, std::string* error);
// Visible CUDA devices (0 when there is no driver or no GPU).
extern "C" int dsl_cuda_device_count();
// kDeviceEngineAbi as the shared object was built.
extern "C" int dsl_cuda_abi_version();
