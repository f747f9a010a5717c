// DeviceEngine: one rank's GPT-2 model, its gradients and its AdamW state on
// an accelerator. The CUDA one lives in its own shared object,
// libdsl_cuda.so (worker/cuda/), which dsworker opens only when a run asks
// for the GPU: the CPU binary needs no CUDA library at run time.
//
// The interface carries only plain C++ types (no Status, no CUDA types), so
// the shared object is built from worker/cuda/ and this header alone. Every
// method that can fail returns false and leaves the reason in error().
// Host buffers are flat parameter vectors in the spec's layout (llm.c's
// order for stages 0 and 1, layer-major for 2 and 3), whole or the rank's
// owned pieces; the engine keeps the same layout on the device.
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
// 3: AdamStep's segments; layer windows and hooks (ZeRO stages 2 and 3);
//    the spec's per-kind layer stride and hook layer bounds.
// 4: PinHost.
// 5: collectives among the ranks' GPUs (NCCL); padded_floats;
//    GradSquaredSum over a range.
// 6: collectives on layer windows; window_floats; ScaleGrads.
// 7: TakeLayerGrads starts a copy, WaitLayerGrads waits for it.
// 8: StartSetParams and WaitSetParams.
// 9: GetParamsRange and SetGradsRange.
// 10: GetGradsRange; AllocateOwned.
constexpr int kDeviceEngineAbi = 10;

// How the matrix products compute; activations, parameters, gradients and
// optimizer state are fp32 in every mode.
enum class DevicePrecision {
  kFp32,  // exact fp32 products (the mode that equals the CPU engine)
  kTf32,  // tensor cores on tf32 (10-bit mantissa) inputs, fp32 sums
  kBf16,  // tensor cores on bf16 inputs, fp32 sums (bf16.enabled)
  kFp16,  // tensor cores on fp16 inputs, fp32 sums (fp16.enabled: the
          // trainer scales the loss; overflows show as a non-finite norm)
};

// The model's shape and where each parameter tensor sits in the flat
// buffer, as worker/param_layout.h computes it in either order: instance l
// of kind k (by ParamKind) starts at offset[k] + l * stride[k], stride 0
// for wte, wpe, lnfw and lnfb (llm.c's order: a per-layer kind's stride is
// its size; layer-major: a block's size).
struct DeviceModelSpec {
  int max_seq_len = 0, vocab_size = 0, padded_vocab_size = 0;
  int num_layers = 0, num_heads = 0, channels = 0;
  size_t num_params = 0;
  size_t offset[16] = {};
  size_t stride[16] = {};
  // Layer-major only (windows below): hook layer h's parameters (-1: wte
  // and wpe, 0..L-1: the blocks, L: lnfw and lnfb) are the flat range
  // [layer_begin[h + 1], layer_begin[h + 2]); L + 3 entries.
  std::vector<size_t> layer_begin;
};

// One contiguous run of AdamStep: `count` parameters at `param` in the
// device's parameter buffer, their gradients at `grad` in its gradient
// buffer and their moments at `moment` in the moment buffers.
struct DeviceAdamSegment {
  size_t param = 0, grad = 0, moment = 0, count = 0;
  bool decay = false;
};

// Where a pass's gradients (and, under ZeRO stage 3, its parameters) live.
enum class DeviceWindows {
  // Whole parameters and gradients stay on the device (stages 0 and 1).
  kNone,
  // Stage 2: whole parameters; each hook layer's gradients only in a window
  // for the pass, taken by the host from AfterBackward (TakeLayerGrads).
  // The gradient buffer holds the rank's owned pieces (owned_count floats)
  // for AdamStep.
  kGrads,
  // Stage 3: the parameters too: each layer's come into a window from
  // BeforeForward/BeforeBackward (SetLayerParams), and the parameter
  // buffer holds the owned pieces (owned_count floats).
  kParamsAndGrads,
};

// ZeRO stages 2 and 3: called from inside TrainMicroBatch and EvalBatch on
// the calling thread, around each hook layer with worker/model.h's
// LayerHooks numbering, order and windows: BeforeForward(l) for
// l = -1..L (evaluation too), BeforeBackward(l) and AfterBackward(l) for
// l = L..-1. A hook may call SetLayerParams (whose copy the device orders
// after the kernels reading the window's old contents, and which returns
// once it has read the host's buffer) and TakeLayerGrads (which starts a
// copy after the device's work so far, whose result WaitLayerGrads waits
// for: the host works on one layer's gradients while the device computes
// the next layer's backward). false stops the pass; the engine's error()
// then names the hook, and the caller knows why.
class DeviceLayerHooks {
 public:
  virtual ~DeviceLayerHooks() = default;
  virtual bool BeforeForward(int layer) = 0;
  virtual bool BeforeBackward(int layer) = 0;
  virtual bool AfterBackward(int layer) = 0;
};

struct DeviceEngineOptions {
  DeviceModelSpec model;
  int device = 0;  // CUDA ordinal within CUDA_VISIBLE_DEVICES
  DevicePrecision precision = DevicePrecision::kFp32;
  // What AdamStep updates, and the floats of each moment on the device:
  // all of the buffer under stage 0, a rank's shard under stage 1, its
  // owned pieces under stages 2 and 3; none (empty, 0) when the optimizer
  // is offloaded to the CPU or the rank's part is all padding.
  std::vector<DeviceAdamSegment> adam;
  size_t moments_count = 0;
  DeviceWindows windows = DeviceWindows::kNone;
  // Under windows: the floats of the owned gradient buffer (and of the
  // owned parameter buffer under kParamsAndGrads); 0 when the optimizer is
  // offloaded (the host keeps them; AllocateOwned gives the device copies
  // for its collectives).
  size_t owned_count = 0;
  DeviceLayerHooks* hooks = nullptr;  // required under windows
  // Without windows: the parameter and gradient buffers hold this many
  // floats when more than num_params (zeros past it), so that collectives
  // split them evenly across ranks.
  size_t padded_floats = 0;
  // Under windows, the least floats of the embedding's window [0] and of
  // the one the other layers share [1] (a layer's range padded to split
  // evenly across ranks, for the collectives on them).
  size_t window_floats[2] = {0, 0};
};

// The hook layer holding instance `layer` of kind k (by ParamKind): -1 for
// wte and wpe, L for lnfw and lnfb, `layer` for a block's.
inline int DeviceHookLayer(const DeviceModelSpec& s, int k, int layer) {
  if (k == 0 || k == 1) return -1;
  if (k == 14 || k == 15) return s.num_layers;
  return layer;
}

// Floats in one instance of kind k (by ParamKind).
inline size_t DeviceKindSize(const DeviceModelSpec& s, int k) {
  const size_t C = static_cast<size_t>(s.channels);
  switch (k) {
    case 0:  // wte
      return static_cast<size_t>(s.padded_vocab_size) * C;
    case 1:  // wpe
      return static_cast<size_t>(s.max_seq_len) * C;
    case 4:  // qkvw
      return 3 * C * C;
    case 5:  // qkvb
      return 3 * C;
    case 6:  // attprojw
      return C * C;
    case 10:  // fcw
    case 12:  // fcprojw
      return 4 * C * C;
    case 11:  // fcb
      return 4 * C;
    default:  // the LayerNorms' weights and biases, attprojb, fcprojb
      return C;
  }
}

// What is wrong with options for their model, or "": every tensor inside
// the buffer and, under windows, inside its hook layer's range; windows
// with hooks and sorted layer bounds; every Adam segment inside the
// buffers it names. Device engines refuse options that fail this.
inline std::string CheckDeviceOptions(const DeviceEngineOptions& o) {
  const DeviceModelSpec& s = o.model;
  const size_t n = s.num_params;
  const int L = s.num_layers;
  if (L < 1 || s.channels < 1 || s.num_heads < 1 || s.max_seq_len < 1 ||
      s.vocab_size < 1 || s.padded_vocab_size < s.vocab_size)
    return "an empty model spec";
  const bool windows = o.windows != DeviceWindows::kNone;
  const auto& b = s.layer_begin;
  if (windows) {
    if (o.hooks == nullptr) return "layer windows without hooks";
    if (b.size() != static_cast<size_t>(L) + 3 || b.front() != 0 ||
        b.back() != n)
      return "layer windows without the layer bounds";
    for (size_t i = 1; i < b.size(); ++i) {
      if (b[i] < b[i - 1]) return "layer bounds out of order";
    }
  }
  for (int k = 0; k < 16; ++k) {
    const int instances = DeviceHookLayer(s, k, 0) == 0 ? L : 1;
    for (int l = 0; l < instances; ++l) {
      const size_t size = DeviceKindSize(s, k);
      if (s.stride[k] != 0 && static_cast<size_t>(l) > (n / s.stride[k]))
        return "a parameter tensor past the buffer";
      const size_t at = s.offset[k] + static_cast<size_t>(l) * s.stride[k];
      if (at > n || size > n - at) return "a parameter tensor past the buffer";
      if (!windows) continue;
      const int h = DeviceHookLayer(s, k, l);
      if (at < b[h + 1] || at + size > b[h + 2])
        return "a parameter tensor outside its layer's window";
    }
  }
  const size_t params =
      o.windows == DeviceWindows::kParamsAndGrads ? o.owned_count : n;
  const size_t grads = windows ? o.owned_count : n;
  for (const DeviceAdamSegment& a : o.adam) {
    if (a.count > params || a.param > params - a.count || a.count > grads ||
        a.grad > grads - a.count || a.count > o.moments_count ||
        a.moment > o.moments_count - a.count)
      return "an optimizer segment past its buffers";
  }
  return "";
}

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

  // Host <-> device copies of whole buffers. Parameters: num_params floats
  // (padded_floats when more), owned_count (or AllocateOwned's count)
  // under kParamsAndGrads. Gradients: the same, the owned count under
  // windows. Moments: moments_count each.
  virtual bool SetParams(const float* host) = 0;
  virtual bool GetParams(float* host) = 0;
  virtual bool SetGrads(const float* host) = 0;
  virtual bool GetGrads(float* host) = 0;
  virtual bool SetMoments(const float* m, const float* v) = 0;
  virtual bool GetMoments(float* m, float* v) = 0;
  // The same for [begin, begin + count) of the buffer only, from or to host
  // [0, count) (a rank's shard, where the rest is not needed).
  virtual bool GetParamsRange(size_t begin, size_t count, float* host) = 0;
  virtual bool SetGradsRange(size_t begin, size_t count, const float* host) = 0;
  virtual bool GetGradsRange(size_t begin, size_t count, float* host) = 0;
  // Starts copying host [0, count) into the parameter buffer's [begin,
  // begin + count), after the device's work so far, and returns; several
  // may run at once. Until WaitSetParams returns (which must follow every
  // start; a start that fails leaves nothing running) the host leaves that
  // memory alone and nothing uses the device's parameters: the host
  // updates the next range while the last one is copied.
  virtual bool StartSetParams(size_t begin, size_t count,
                              const float* host) = 0;
  virtual bool WaitSetParams() = 0;
  // Under kParamsAndGrads, from a hook: layer's parameters (its whole
  // layer-major range) into its window for the pass.
  virtual bool SetLayerParams(int layer, const float* host) = 0;
  // Under windows, from AfterBackward(layer): starts the copy of the
  // layer's gradients of this pass (its whole range) to `host`, after the
  // device's work so far; its window is then zero again. `host` holds them
  // once WaitLayerGrads(layer) returns, and must not be touched before.
  // One copy a layer at a time; every copy started is waited for, in the
  // pass or after it (a pass that stopped); a Take that fails leaves no
  // copy running.
  virtual bool TakeLayerGrads(int layer, float* host) = 0;
  virtual bool WaitLayerGrads(int layer) = 0;

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
  // Sum of the squared gradients [begin, begin + count) of the gradient
  // buffer, in double.
  virtual bool GradSquaredSum(size_t begin, size_t count, double* out) = 0;
  // Over each of options.adam's segments one AdamW step on the gradients
  // times grad_scale (as read; the buffer stays), nothing without segments.
  virtual bool AdamStep(const DeviceAdam& adam, float grad_scale) = 0;

  // Collectives among the ranks' GPUs, one GPU a rank (NCCL, loaded on
  // first use), on the whole parameter and gradient buffers (padded_floats)
  // without windows. CollectivesIdentity loads NCCL and names this GPU (its
  // UUID), false where NCCL cannot load; rank 0 makes a CollectivesId
  // (opaque bytes) which every rank passes to CollectivesJoin, which starts
  // joining and returns; CollectivesWait waits until every rank has joined.
  // Every wait, there and in the collectives, lasts at most timeout_s, then
  // aborts the communicator and fails (a peer gone or stuck).
  // CollectivesLeave aborts it (the ranks fall back together).
  virtual bool CollectivesIdentity(std::string* identity) = 0;
  virtual bool CollectivesId(std::string* id) = 0;
  virtual bool CollectivesJoin(const std::string& id, int rank, int world,
                               double timeout_s) = 0;
  virtual bool CollectivesWait() = 0;
  virtual void CollectivesLeave() = 0;
  // The gradients summed over ranks, then times scale.
  virtual bool AllReduceGrads(float scale) = 0;
  // Rank r's chunk [r * chunk, (r + 1) * chunk) of the gradients summed over
  // ranks, in place, then times scale (the other chunks are clobbered).
  virtual bool ReduceScatterGrads(size_t chunk, int rank, float scale) = 0;
  // Every rank's chunk of the parameters into every rank's buffer.
  virtual bool AllGatherParams(size_t chunk, int rank) = 0;
  // The gradient buffer times scale.
  virtual bool ScaleGrads(float scale) = 0;
  // ZeRO 2 and 3 with the collectives joined, from the hooks in place of
  // SetLayerParams and TakeLayerGrads: a layer's window taken as world
  // chunks of `chunk` floats (window_floats covers them).
  //  GatherLayerParams (stage 3): this rank's owned parameters [owned_at,
  //    owned_at + chunk) into chunk `rank`, then every rank's chunk.
  //  ReduceLayerGrads: the window's gradients summed over ranks; chunk
  //    `rank` of the sum added to the owned gradients at owned_at; the
  //    window zeroed.
  //  GatherLayerPieces (stage 2, after AdamStep, or after the host's
  //    updated pieces came with StartSetParams): the whole parameters'
  //    [at, at + count) (this rank's updated piece, count <= chunk) from
  //    every rank, in rank order, into the layer's range.
  virtual bool GatherLayerParams(int layer, size_t owned_at, size_t chunk,
                                 int rank) = 0;
  virtual bool ReduceLayerGrads(int layer, size_t owned_at, size_t chunk,
                                int rank) = 0;
  virtual bool GatherLayerPieces(int layer, size_t at, size_t count,
                                 size_t chunk, int rank) = 0;
  // Under windows, opened with owned_count 0 (the optimizer offloaded):
  // owned buffers of `count` floats, zeroed, for the collectives on layer
  // windows once they are joined: the gradients' (ReduceLayerGrads adds
  // into them; the host takes them with GetGrads) and under kParamsAndGrads
  // the parameters' too (GatherLayerParams reads them; the host's updated
  // pieces come with StartSetParams). Once, before any pass.
  virtual bool AllocateOwned(size_t count) = 0;

  // Page-locks [p, p + bytes) of host memory the host copies to and from,
  // so the copies run at the bus's speed, until the engine is destroyed
  // (which must come before the memory is freed). Best effort: false
  // leaves it pageable (a memlock limit, say), which only costs speed.
  virtual bool PinHost(void* p, size_t bytes) = 0;

  // Peak bytes this engine has had allocated on the device.
  virtual int64_t peak_memory_bytes() const = 0;
  // The parameter, gradient and moment buffers, in bytes (not the windows
  // or activations).
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
