// The GPU engines: a model on a DeviceEngine (worker/device_engine.h, the
// CUDA one in libdsl_cuda.so), with the optimizer on the device or
// offloaded to the CPU (offload_optimizer: {device: cpu}). The host keeps
// the state the CPU engine keeps for the same stage and the device
// computes. What ranks exchange passes through host memory (Gloo), unless
// every rank has a GPU of its own and NCCL loads everywhere: then the
// device's collectives (gpu_collectives.h) replace the host's below, and
// the host's copy serves checkpoints.
//  - stages 0 and 1 (GpuReplicatedEngine): the device holds whole
//    parameters and gradients; a ReplicatedState (replicated_state.h)
//    all-reduces or reduce-scatters the gradients on the host, and each
//    rank updates its shard, on the device (only that shard's moments are
//    there) or on the host, the parameters then all-gathered.
//  - stages 2 and 3 (GpuShardedEngine): a ZeroState (zero_state.h) as the
//    CPU engine's, the device in layer-major order with each layer's
//    gradients only in a window for the pass (DeviceWindows), taken to the
//    host after the layer's backward and reduce-scattered there in the
//    buckets the CPU engine uses; under stage 3 each layer's parameters
//    come into a window from the host just before the layer runs. The
//    device keeps the owned pieces (gradients, moments, and under stage 3
//    parameters) for its AdamW; offloaded, nothing of them over Gloo, and
//    with NCCL the owned gradients (and stage 3's owned parameters) its
//    collectives reduce into (and gather from), copied to and from the
//    host's AdamW as DeepSpeed's ZeRO-Offload does.
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <span>
#include <string>
#include <vector>

#include "worker/device_engine.h"
#include "worker/engine.h"
#include "worker/gpu_collectives.h"
#include "worker/model.h"
#include "worker/replicated_state.h"
#include "worker/zero_state.h"

namespace dslaunch::worker {
namespace {

// What both GPU engines do alike: the device, its options and its passes.
class GpuEngine : public Engine {
 public:
  const ModelConfig& model_config() const override { return layout_->config(); }
  size_t num_params() const override { return layout_->num_params(); }

  StatusOr<float> TrainMicroBatch(const Batch& b, float grad_scale) override {
    float loss = 0;
    RETURN_IF_ERROR(
        Ok(dev_->TrainMicroBatch(b.inputs.data(), b.targets.data(),
                                 b.batch_size, b.seq_len, grad_scale, &loss)));
    return loss;
  }
  StatusOr<float> EvalBatch(const Batch& b) override {
    float loss = 0;
    RETURN_IF_ERROR(Ok(dev_->EvalBatch(b.inputs.data(), b.targets.data(),
                                       b.batch_size, b.seq_len, &loss)));
    return loss;
  }
  int64_t device_memory_bytes() const override {
    return dev_->peak_memory_bytes();
  }

 protected:
  explicit GpuEngine(Comm* comm) : comm_(comm) {}

  // The model's parameters in `order`: from options.init_model, or the
  // GPT-2 init with train.seed (the layout then set, the parameters not).
  StatusOr<std::unique_ptr<Model>> ReadOrCreate(const TrainConfig& config,
                                                const EngineOptions& options,
                                                ParamOrder order) {
    std::unique_ptr<Model> model;
    if (!options.init_model.empty()) {
      ASSIGN_OR_RETURN(model, ReadModelFile(options.init_model, order));
    } else {
      const ModelSection& m = config.model;
      ASSIGN_OR_RETURN(
          model, Model::Create(ModelConfig::Make(m.seq_len, m.vocab_size,
                                                 m.n_layer, m.n_head, m.n_embd),
                               order));
    }
    layout_ = std::make_unique<ParamLayout>(model->layout());
    return model;
  }

  // The options every mode shares: the spec of layout_, the GPU for this
  // rank, the precision.
  DeviceEngineOptions BaseOptions(const TrainConfig& config,
                                  const EngineOptions& options) const {
    const ParamLayout& layout = *layout_;
    const ModelConfig& mc = layout.config();
    DeviceEngineOptions o;
    DeviceModelSpec& s = o.model;
    s.max_seq_len = mc.max_seq_len;
    s.vocab_size = mc.vocab_size;
    s.padded_vocab_size = mc.padded_vocab_size;
    s.num_layers = mc.num_layers;
    s.num_heads = mc.num_heads;
    s.channels = mc.channels;
    s.num_params = layout.num_params();
    for (int k = 0; k < kNumParamKinds; ++k) {
      const auto kind = static_cast<ParamKind>(k);
      s.offset[k] = layout.Offset(kind, 0);
      // Instance 1's offset where there is one; any stride serves one layer.
      s.stride[k] = !IsPerLayer(kind)   ? 0
                    : mc.num_layers > 1 ? layout.Offset(kind, 1) - s.offset[k]
                                        : layout.Size(kind);
    }
    if (layout.order() == ParamOrder::kLayerMajor) {
      for (int l = -1; l <= mc.num_layers; ++l)
        s.layer_begin.push_back(layout.LayerRanges(l).at(0).begin);
      s.layer_begin.push_back(layout.num_params());
    }
    std::string why;
    o.device = DeviceForLocalRank(options.local_rank, CudaDeviceCount(&why));
    // fp32 configs compute exact fp32 products unless DSL_CUDA_TF32=1 lets
    // the tensor cores round their inputs to tf32 (PyTorch's allow_tf32).
    const char* tf32 = std::getenv("DSL_CUDA_TF32");
    o.precision = config.bf16           ? DevicePrecision::kBf16
                  : config.fp16.enabled ? DevicePrecision::kFp16
                  : tf32 != nullptr && std::string(tf32) == "1"
                      ? DevicePrecision::kTf32
                      : DevicePrecision::kFp32;
    return o;
  }

  Status Ok(bool ok) const {
    if (ok) return Status::Ok();
    return Internal("GPU: " + dev_->error());
  }
  // Page-locks the host buffers the device copies to and from (each
  // derived engine's destructor drops dev_ first, which releases them).
  void Pin(const std::vector<std::span<float>>& buffers) {
    for (std::span<float> b : buffers) {
      if (!dev_->PinHost(b.data(), b.size_bytes())) pinned_ = false;
    }
  }
  // What Describe adds about the device and host memory.
  std::string DescribeDevice() const {
    return "GPU " + dev_->Describe() +
           (pinned_ ? "" : ", host buffers pageable (page-locking failed)");
  }
  // A step of the host's (an optimizer step, a gather) over its parameter
  // buffer `params`, each range it finishes started on its way to the
  // device's while the host goes on with the next; every copy waited for
  // whatever the step returns (they read host memory).
  template <typename Step>
  Status UpdatingTheDevice(const float* params, const Step& step) {
    const Status st = step([&](size_t begin, size_t count) {
      return Ok(dev_->StartSetParams(begin, count, params + begin));
    });
    const bool waited = dev_->WaitSetParams();
    RETURN_IF_ERROR(st);
    return Ok(waited);
  }
  static DeviceAdam ToDevice(const AdamParams& a) {
    return {a.lr,           a.beta1,      a.beta2, a.eps,
            a.weight_decay, a.adamw_mode, a.step};
  }

  // The ranks' collectives (gpu_collectives.h), when there are several or
  // DSL_NCCL=1 asks for NCCL on one.
  Status SetUpCollectives() {
    if (comm_->size() == 1 && !NcclForced()) return Status::Ok();
    ASSIGN_OR_RETURN(Collectives c, ChooseCollectives(*comm_, *dev_));
    nccl_ = c.nccl;
    collectives_ = c.describe;
    return Status::Ok();
  }

  Comm* comm_;
  bool offload_ = false;
  bool pinned_ = true;
  bool nccl_ = false;        // the collectives run on the GPUs
  std::string collectives_;  // which and why, for Describe; "" on one rank
  std::unique_ptr<ParamLayout> layout_;
  std::unique_ptr<DeviceEngine> dev_;
};

// ------------------------------------------------------------ stages 0, 1

class GpuReplicatedEngine final : public GpuEngine {
 public:
  explicit GpuReplicatedEngine(Comm* comm) : GpuEngine(comm) {}
  ~GpuReplicatedEngine() override { dev_.reset(); }

  Status Init(const TrainConfig& config, const EngineOptions& options,
              const DeviceOpener& open) {
    ASSIGN_OR_RETURN(host_, ReadOrCreate(config, options, ParamOrder::kLlmc));
    if (options.init_model.empty()) host_->InitParams(config.train.seed);
    // Stage 2 runs on GpuShardedEngine; 0 and 1 here.
    stage_ = config.zero.stage;
    offload_ = config.zero.offload_optimizer == OffloadDevice::kCpu;
    state_ = std::make_unique<ReplicatedState>(host_.get(), stage_, comm_);
    DeviceEngineOptions o = BaseOptions(config, options);
    if (!offload_) {
      // AdamW over this rank's shard, cut at the decay segments; the
      // moments are the shard's only.
      const size_t lo = state_->shard_begin(), hi = lo + state_->shard_real();
      for (const DecaySegment& seg : layout_->DecaySegments()) {
        const size_t b = std::max(lo, seg.range.begin),
                     e = std::min(hi, seg.range.end);
        if (b < e) o.adam.push_back({b, b, b - lo, e - b, seg.decay});
      }
      o.moments_count = state_->shard_real();
    }
    // Padded as the host's, so that collectives split them evenly.
    o.padded_floats = host_->params().size();
    ASSIGN_OR_RETURN(dev_, open(o));
    Pin({host_->params(), host_->grads(), state_->m(), state_->v()});
    RETURN_IF_ERROR(Push());
    return SetUpCollectives();
  }

  Status ZeroGrad() override { return Ok(dev_->ZeroGrad()); }

  StatusOr<float> FinishGradients() override {
    if (nccl_) {
      ASSIGN_OR_RETURN(float norm, FinishOnTheGpus());
      // Offloaded, the host's AdamW takes the reduced gradients it updates:
      // all of them (stage 0), or its shard's (stage 1).
      if (!offload_) return norm;
      const size_t lo = state_->shard_begin();
      RETURN_IF_ERROR(Ok(dev_->GetGradsRange(lo, state_->shard_real(),
                                             host_->grads().data() + lo)));
      return norm;
    }
    if (!ThroughHost()) {
      // One rank, the optimizer on the device: nothing leaves it.
      double squares = 0;
      RETURN_IF_ERROR(Ok(dev_->GradSquaredSum(0, num_params(), &squares)));
      return static_cast<float>(std::sqrt(squares));
    }
    float* g = host_->grads().data();
    RETURN_IF_ERROR(Ok(dev_->GetGrads(g)));
    ASSIGN_OR_RETURN(float norm, state_->FinishGradients());
    // The device's optimizer steps on the reduced gradients of its part:
    // all of them (stage 0), or its shard's (stage 1).
    if (offload_) return norm;
    if (stage_ == 0) {
      RETURN_IF_ERROR(Ok(dev_->SetGrads(g)));
      return norm;
    }
    const size_t lo = state_->shard_begin();
    RETURN_IF_ERROR(Ok(dev_->SetGradsRange(lo, state_->shard_real(), g + lo)));
    return norm;
  }

  Status Update(const AdamParams& a, float clip_scale) override {
    if (offload_) {
      // ZeRO-Offload: AdamW on the host's fp32 master parameters (this
      // rank's shard under stage 1), each piece copied to the device as it
      // is done; under stage 1 the shards then gathered, on the GPUs with
      // NCCL, else on the host and the whole copied.
      const auto step = [&](const ParamsUpdated& updated) {
        return state_->Step(a, clip_scale, updated);
      };
      float* p = host_->params().data();
      if (nccl_ || stage_ == 0 || comm_->size() == 1) {
        RETURN_IF_ERROR(UpdatingTheDevice(p, step));
        if (stage_ == 0 || comm_->size() == 1) return Status::Ok();
        return Ok(dev_->AllGatherParams(state_->shard_size(), comm_->rank()));
      }
      RETURN_IF_ERROR(state_->Update(a, clip_scale));
      return Ok(dev_->SetParams(p));
    }
    RETURN_IF_ERROR(Ok(dev_->AdamStep(ToDevice(a), clip_scale)));
    if (stage_ == 0 || comm_->size() == 1) return Status::Ok();
    // Stage 1: each rank updated its shard; every rank needs all of them.
    if (nccl_) {
      return Ok(dev_->AllGatherParams(state_->shard_size(), comm_->rank()));
    }
    // This rank's shard to the host, gathered there, and every other
    // rank's to the device.
    float* p = host_->params().data();
    const size_t lo = state_->shard_begin(), end = lo + state_->shard_real();
    const size_t n = host_->params().size();
    RETURN_IF_ERROR(Ok(dev_->GetParamsRange(lo, end - lo, p + lo)));
    RETURN_IF_ERROR(state_->GatherParams());
    return UpdatingTheDevice(p, [&](const ParamsUpdated& updated) {
      if (lo > 0) RETURN_IF_ERROR(updated(0, lo));
      return end < n ? updated(end, n - end) : Status::Ok();
    });
  }

  StatusOr<RankShard> CheckpointRange(size_t begin, size_t count) override {
    RETURN_IF_ERROR(Pull());
    return state_->CheckpointRange(begin, count);
  }

  Status Resume(const std::string& dir) override {
    RETURN_IF_ERROR(state_->Resume(dir));
    return Push();
  }

  StatusOr<std::vector<float>> WholeParams() override {
    RETURN_IF_ERROR(Pull());
    auto p = host_->params().first(num_params());
    return std::vector<float>(p.begin(), p.end());
  }

  // On the device, and the host's moments where the optimizer is offloaded.
  int64_t state_bytes() const override {
    return dev_->state_bytes() + (offload_ ? state_->moment_bytes() : 0);
  }
  std::string Describe() const override {
    return DescribeDevice() +
           (offload_ ? ", optimizer offloaded to the CPU" : "") +
           (collectives_.empty() ? "" : ", collectives " + collectives_);
  }

 private:
  // The gradients reduced on the GPUs (all of them, or this rank's shard)
  // and averaged; the global norm of what this rank updates, as
  // ReplicatedState::FinishGradients computes it.
  StatusOr<float> FinishOnTheGpus() {
    const float scale = 1.0f / static_cast<float>(comm_->size());
    double squares = 0;
    if (stage_ == 0) {
      RETURN_IF_ERROR(Ok(dev_->AllReduceGrads(scale)));
      RETURN_IF_ERROR(Ok(dev_->GradSquaredSum(0, num_params(), &squares)));
      return static_cast<float>(std::sqrt(squares));
    }
    RETURN_IF_ERROR(Ok(
        dev_->ReduceScatterGrads(state_->shard_size(), comm_->rank(), scale)));
    RETURN_IF_ERROR(Ok(dev_->GradSquaredSum(state_->shard_begin(),
                                            state_->shard_real(), &squares)));
    float partial = static_cast<float>(squares);
    RETURN_IF_ERROR(comm_->AllReduceSum(&partial, 1));
    return static_cast<float>(std::sqrt(static_cast<double>(partial)));
  }

  // Gradients pass through host memory: to be reduced over Gloo, or for the
  // host's optimizer.
  bool ThroughHost() const { return offload_ || comm_->size() > 1; }
  // The host's parameters and moments to the device; from it. Offloaded,
  // the host's are the master copies and the device holds no moments.
  Status Push() {
    RETURN_IF_ERROR(Ok(dev_->SetParams(host_->params().data())));
    if (offload_) return Status::Ok();
    return Ok(dev_->SetMoments(state_->m().data(), state_->v().data()));
  }
  Status Pull() {
    // Offloaded, the host's shard is the master copy; with NCCL only the
    // GPUs have gathered the other shards.
    if (offload_ && !nccl_) return Status::Ok();
    RETURN_IF_ERROR(Ok(dev_->GetParams(host_->params().data())));
    if (offload_) return Status::Ok();
    return Ok(dev_->GetMoments(state_->m().data(), state_->v().data()));
  }

  int stage_ = 0;
  std::unique_ptr<Model> host_;
  std::unique_ptr<ReplicatedState> state_;
};

// ------------------------------------------------------------ stages 2, 3

class GpuShardedEngine final : public GpuEngine, DeviceLayerHooks {
 public:
  explicit GpuShardedEngine(Comm* comm) : GpuEngine(comm) {}
  ~GpuShardedEngine() override { dev_.reset(); }

  Status Init(const TrainConfig& config, const EngineOptions& options,
              const DeviceOpener& open) {
    ASSIGN_OR_RETURN(std::unique_ptr<Model> model,
                     ReadOrCreate(config, options, ParamOrder::kLayerMajor));
    stage_ = config.zero.stage;
    // offload_param keeps the parameter shards on the host, and so the
    // optimizer that updates them: both offloaded.
    offload_ =
        config.zero.offload_optimizer == OffloadDevice::kCpu ||
        (stage_ == 3 && config.zero.offload_param == OffloadDevice::kCpu);
    zero_ = std::make_unique<ZeroState>(*layout_, stage_, comm_,
                                        config.zero.reduce_bucket_size);
    if (options.init_model.empty()) {
      zero_->InitParams(config.train.seed);
    } else {
      zero_->LoadParams(model->params());
    }
    model.reset();  // the host's copy is the ZeroState's
    // The device's copies fill each layer's gradient window in whole.
    hooks_ = zero_->Hooks(ZeroState::GradWindows::kCopied);
    DeviceEngineOptions o = BaseOptions(config, options);
    o.windows =
        stage_ == 3 ? DeviceWindows::kParamsAndGrads : DeviceWindows::kGrads;
    o.hooks = this;
    if (!offload_) {
      for (const ZeroState::AdamRun& r : zero_->adam_runs())
        o.adam.push_back({r.param, r.grad, r.moment, r.count, r.decay});
      o.owned_count = o.moments_count = zero_->owned_floats();
    }
    // Windows that split evenly across ranks, for collectives on them.
    const int world = comm_->size();
    o.window_floats[0] = zero_->owned_piece(-1).shard * world;
    for (int l = 0; l <= layout_->config().num_layers; ++l) {
      o.window_floats[1] =
          std::max(o.window_floats[1], zero_->owned_piece(l).shard * world);
    }
    ASSIGN_OR_RETURN(dev_, open(o));
    Pin(zero_->buffers());
    RETURN_IF_ERROR(SetUpCollectives());
    // Offloaded, with the collectives on the GPUs: the device holds the
    // owned gradients the reduces add into (and under stage 3 the owned
    // parameters the gathers read), the host's AdamW their master copies.
    if (offload_ && nccl_) {
      RETURN_IF_ERROR(Ok(dev_->AllocateOwned(zero_->owned_floats())));
    }
    return Push();
  }

  Status ZeroGrad() override {
    if (nccl_) return Ok(dev_->ZeroGrad());  // the owned ones are there
    zero_->ZeroGrad();
    return Status::Ok();
  }

  // The pass ran the hooks, which reduced each bucket; a collective's error
  // there stops the pass, and it is the one reported.
  StatusOr<float> TrainMicroBatch(const Batch& b, float grad_scale) override {
    StatusOr<float> loss = GpuEngine::TrainMicroBatch(b, grad_scale);
    // A pass that stopped may have left a gradient copy landing in the
    // host's windows: waited for before anything else uses them.
    if (pending_ != kNone) {
      dev_->WaitLayerGrads(pending_);
      pending_ = kNone;
    }
    RETURN_IF_ERROR(zero_->status());
    return loss;
  }
  StatusOr<float> EvalBatch(const Batch& b) override {
    StatusOr<float> loss = GpuEngine::EvalBatch(b);
    RETURN_IF_ERROR(zero_->status());
    return loss;
  }

  StatusOr<float> FinishGradients() override {
    if (nccl_) {
      // As ZeroState::FinishGradients, on the GPU's owned gradients.
      RETURN_IF_ERROR(
          Ok(dev_->ScaleGrads(1.0f / static_cast<float>(comm_->size()))));
      double squares = 0;
      RETURN_IF_ERROR(
          Ok(dev_->GradSquaredSum(0, zero_->owned_floats(), &squares)));
      float partial = static_cast<float>(squares);
      RETURN_IF_ERROR(comm_->AllReduceSum(&partial, 1));
      // Offloaded, the host's AdamW takes the owned pieces, reduced.
      if (offload_) {
        RETURN_IF_ERROR(
            Ok(dev_->GetGrads(zero_->Buffer(ZeroState::Which::kGrads).data())));
      }
      return std::sqrt(partial);
    }
    ASSIGN_OR_RETURN(float norm, zero_->FinishGradients());
    if (!offload_) {
      RETURN_IF_ERROR(
          Ok(dev_->SetGrads(zero_->Buffer(ZeroState::Which::kGrads).data())));
    }
    return norm;
  }

  Status Update(const AdamParams& a, float clip_scale) override {
    float* params = zero_->Buffer(ZeroState::Which::kParams).data();
    if (offload_ && nccl_) {
      // AdamW on the host's owned pieces, layer by layer, each piece copied
      // to the device's as it is done while the host goes on; then under
      // stage 2 gathered on the GPUs (under stage 3 the next pass gathers
      // them).
      RETURN_IF_ERROR(
          UpdatingTheDevice(params, [&](const ParamsUpdated& updated) {
            return zero_->Update(a, clip_scale, updated,
                                 ZeroState::GatheredBy::kTheDevice);
          }));
      return GatherPiecesOnTheGpus();
    }
    if (offload_) {
      // AdamW on the host's owned pieces, layer by layer; under stage 2
      // each layer gathered and copied to the device as it is done, while
      // the host goes on (under stage 3 the next pass gathers them).
      if (stage_ == 3) return zero_->Update(a, clip_scale);
      return UpdatingTheDevice(params, [&](const ParamsUpdated& updated) {
        return zero_->Update(a, clip_scale, updated);
      });
    }
    RETURN_IF_ERROR(Ok(dev_->AdamStep(ToDevice(a), clip_scale)));
    if (nccl_) return GatherPiecesOnTheGpus();
    // The updated pieces to the host, which gathers them: into every
    // rank's whole parameters now (stage 2), or layer by layer in the next
    // pass (stage 3).
    RETURN_IF_ERROR(Ok(dev_->GetParams(params)));
    if (stage_ == 3) return Status::Ok();
    if (comm_->size() == 1) return Status::Ok();
    return UpdatingTheDevice(params, [&](const ParamsUpdated& updated) {
      return zero_->GatherParams(updated);
    });
  }

  StatusOr<RankShard> CheckpointRange(size_t begin, size_t count) override {
    RETURN_IF_ERROR(Pull());
    return zero_->CheckpointRange(begin, count);
  }
  Status Resume(const std::string& dir) override {
    RETURN_IF_ERROR(zero_->Resume(dir));
    return Push();
  }
  StatusOr<std::vector<float>> WholeParams() override {
    RETURN_IF_ERROR(Pull());
    return zero_->WholeParams();
  }

  // The device's buffers, and what the host holds when offloaded: the
  // owned gradients and moments, and under stage 3 the owned parameters.
  // Either way the ZeRO law of the stage (zero_state.h); offloaded with
  // NCCL, the device's owned buffers for its collectives on top (both
  // sides hold those).
  int64_t state_bytes() const override {
    int64_t host = 0;
    if (offload_) {
      host = 12 * static_cast<int64_t>(zero_->owned_floats());
      if (stage_ == 3) host += 4 * static_cast<int64_t>(zero_->owned_floats());
    }
    return dev_->state_bytes() + host;
  }
  std::string Describe() const override {
    const int n = zero_->num_buckets();
    // With NCCL each layer is reduced as its backward ends.
    std::string s =
        DescribeDevice() + ", " +
        (nccl_ ? std::string("a reduce per layer")
               : std::to_string(n) + " gradient bucket" + (n == 1 ? "" : "s"));
    if (offload_) {
      s += stage_ == 3 ? ", parameter shards and optimizer on the CPU"
                       : ", optimizer offloaded to the CPU";
    }
    if (!collectives_.empty()) s += ", collectives " + collectives_;
    return s;
  }

  // DeviceLayerHooks: the ZeroState's hooks, with the layer's windows
  // moved between the host and the device around them; with NCCL, the
  // same gathers and reduces on the GPUs, the host out of the pass.
  bool BeforeForward(int layer) override {
    if (nccl_) return Gather(layer);
    hooks_.before_forward(layer);
    return Supply(layer);
  }
  bool BeforeBackward(int layer) override {
    // Layer -1's backward reads no parameters (and its window stays).
    if (nccl_) return layer == -1 || Gather(layer);
    hooks_.before_backward(layer);
    return layer == -1 || Supply(layer);
  }
  bool AfterBackward(int layer) override {
    if (nccl_) {
      const ZeroState::OwnedPiece p = zero_->owned_piece(layer);
      return dev_->ReduceLayerGrads(layer, p.at, p.shard, comm_->rank());
    }
    // The layer before's gradients, copied while this layer's backward
    // was queued, go to the host's hooks (its bucket's reduce) while the
    // device computes this layer; this layer's copy starts after them, as
    // a reduce may work in the window the copy lands in.
    if (!FinishPending()) return false;
    if (!dev_->TakeLayerGrads(layer, zero_->LayerGrads(layer))) return false;
    pending_ = layer;
    return layer != -1 || FinishPending();  // the pass's last
  }

 private:
  // The copy of pending_'s gradients waited for and handed to the hooks.
  bool FinishPending() {
    if (pending_ == kNone) return true;
    const int layer = pending_;
    pending_ = kNone;
    if (!dev_->WaitLayerGrads(layer)) return false;
    hooks_.after_backward(layer);
    return zero_->status().ok();
  }
  // Stage 2 with NCCL, after the step: every rank's updated pieces
  // gathered on the GPUs, layer by layer (under stage 3 the next pass
  // gathers them).
  Status GatherPiecesOnTheGpus() {
    if (stage_ == 3) return Status::Ok();
    for (int l = -1; l <= layout_->config().num_layers; ++l) {
      const ZeroState::OwnedPiece p = zero_->owned_piece(l);
      RETURN_IF_ERROR(Ok(
          dev_->GatherLayerPieces(l, p.begin, p.own, p.shard, comm_->rank())));
    }
    return Status::Ok();
  }
  // Stage 3 with NCCL: the layer's parameters gathered on the GPUs.
  bool Gather(int layer) {
    if (stage_ != 3) return true;
    const ZeroState::OwnedPiece p = zero_->owned_piece(layer);
    return dev_->GatherLayerParams(layer, p.at, p.shard, comm_->rank());
  }
  // Stage 3: the layer's parameters, just gathered, into its window.
  bool Supply(int layer) {
    if (!zero_->status().ok()) return false;
    return stage_ != 3 ||
           dev_->SetLayerParams(layer, zero_->LayerParams(layer));
  }
  // The host's state to the device: the parameters it keeps (whole under
  // stage 2; owned under stage 3, unless offloaded over Gloo, where only
  // the host keeps them) and the moments unless offloaded.
  Status Push() {
    using W = ZeroState::Which;
    if (stage_ == 2 || !offload_ || nccl_) {
      RETURN_IF_ERROR(Ok(dev_->SetParams(zero_->Buffer(W::kParams).data())));
    }
    if (offload_) return Status::Ok();
    return Ok(dev_->SetMoments(zero_->Buffer(W::kM).data(),
                               zero_->Buffer(W::kV).data()));
  }
  // The device's state to the host, for checkpoints: what only the device
  // updates. The moments unless offloaded; with NCCL the parameters too
  // (only the GPUs gathered the other ranks' pieces under stage 2, and the
  // device's AdamW updated the owned ones), except offloaded under stage
  // 3, where the host's owned parameters are the master copies. Over Gloo
  // the host has them after every Update.
  Status Pull() {
    using W = ZeroState::Which;
    if (nccl_ && (stage_ == 2 || !offload_)) {
      RETURN_IF_ERROR(Ok(dev_->GetParams(zero_->Buffer(W::kParams).data())));
    }
    if (offload_) return Status::Ok();
    return Ok(dev_->GetMoments(zero_->Buffer(W::kM).data(),
                               zero_->Buffer(W::kV).data()));
  }

  int stage_ = 2;
  std::unique_ptr<ZeroState> zero_;
  LayerHooks hooks_;
  // The layer whose gradient copy is running, not yet handed to hooks_.
  static constexpr int kNone = -2;
  int pending_ = kNone;
};

}  // namespace

StatusOr<std::unique_ptr<Engine>> MakeGpuEngine(const TrainConfig& config,
                                                Comm* comm,
                                                const EngineOptions& options,
                                                const DeviceOpener& open) {
  if (config.zero.stage >= 2) {
    auto e = std::make_unique<GpuShardedEngine>(comm);
    RETURN_IF_ERROR(e->Init(config, options, open));
    return std::unique_ptr<Engine>(std::move(e));
  }
  auto e = std::make_unique<GpuReplicatedEngine>(comm);
  RETURN_IF_ERROR(e->Init(config, options, open));
  return std::unique_ptr<Engine>(std::move(e));
}

}  // namespace dslaunch::worker
