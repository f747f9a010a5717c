// GpuShardedEngine: ZeRO stages 2 and 3 on a GPU (gpu_engine.cc has the
// overview): the host's ZeroState, the device's layer windows and hooks.
#include <algorithm>
#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "worker/gpu/gpu_engine.h"
#include "worker/zero_state.h"

namespace dslaunch::worker::gpu {
namespace {

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
    ASSIGN_OR_RETURN(dev_, open(WindowedOptions(config, options)));
    Pin(zero_->buffers());
    RETURN_IF_ERROR(SetUpCollectives());
    // Offloaded, with the collectives on the GPUs: the device holds the
    // owned gradients the reduces add into (and under stage 3 the owned
    // parameters the gathers read), the host's AdamW their master copies.
    if (offload_ && nccl_) RETURN_IF_ERROR(AllocateOwnedTogether());
    return Push();
  }

  // The device in layer-major order with layer windows and this engine's
  // hooks; the owned pieces and AdamW's runs over them unless offloaded.
  DeviceEngineOptions WindowedOptions(const TrainConfig& config,
                                      const EngineOptions& options) {
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
    return o;
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
      ASSIGN_OR_RETURN(float norm, GlobalNorm(squares));
      // Offloaded, the host's AdamW takes the owned pieces, reduced.
      if (offload_) {
        RETURN_IF_ERROR(
            Ok(dev_->GetGrads(zero_->Buffer(ZeroState::Which::kGrads).data())));
      }
      return norm;
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
  // Either way the ZeRO law of the stage (zero_state.h). Offloaded with
  // NCCL the device also keeps owned gradients (and under stage 3 owned
  // parameters) for its collectives: working copies of the host's, left
  // out as the windows are (the device's peak counts them).
  int64_t state_bytes() const override {
    if (!offload_) return dev_->state_bytes();
    const auto owned = static_cast<int64_t>(zero_->owned_floats());
    const int64_t host = (stage_ == 3 ? 16 : 12) * owned;
    const int64_t copies = nccl_ ? (stage_ == 3 ? 8 : 4) * owned : 0;
    return dev_->state_bytes() - copies + host;
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
      // NCCL's gathers read a copy of the shards on the GPU.
      if (nccl_ && stage_ == 3) s += ", a copy of the shards on the GPU";
    }
    return s + DescribeCollectives();
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
  // Offloaded with NCCL: the owned buffers the collectives need on every
  // rank's device, or on none. A rank that cannot allocate them (its GPU
  // full) fails every rank's start at once, naming itself, rather than
  // leaving the others to wait on it in their first collective.
  Status AllocateOwnedTogether() {
    const bool ok = dev_->AllocateOwned(zero_->owned_floats());
    const std::string why = ok ? "" : dev_->error();
    const int world = comm_->size();
    const float mine = ok ? 0.0f : 1.0f;
    std::vector<float> failed(world);
    RETURN_IF_ERROR(comm_->AllGather(&mine, failed.data(), 1));
    for (int r = 0; r < world; ++r) {
      if (failed[r] == 0.0f) continue;
      if (r == comm_->rank()) return Internal("GPU: " + why);
      return Internal("rank " + std::to_string(r) +
                      " could not allocate the owned buffers NCCL's "
                      "collectives need under offload (DSL_NCCL=0 keeps "
                      "Gloo, which needs none)");
    }
    return Status::Ok();
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

StatusOr<std::unique_ptr<Engine>> MakeShardedEngine(
    const TrainConfig& config, Comm* comm, const EngineOptions& options,
    const DeviceOpener& open) {
  return MakeInitialized<GpuShardedEngine>(config, comm, options, open);
}

}  // namespace dslaunch::worker::gpu
