// GpuReplicatedEngine: ZeRO stages 0 and 1 on a GPU (gpu_engine.cc has
// the overview): whole parameters and gradients on the device, the host's
// ReplicatedState for what passes through host memory.
#include <algorithm>
#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "worker/gpu/gpu_engine.h"
#include "worker/replicated_state.h"

namespace dslaunch::worker::gpu {
namespace {

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
           DescribeCollectives();
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
    return GlobalNorm(squares);
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

}  // namespace

StatusOr<std::unique_ptr<Engine>> MakeReplicatedEngine(
    const TrainConfig& config, Comm* comm, const EngineOptions& options,
    const DeviceOpener& open) {
  return MakeInitialized<GpuReplicatedEngine>(config, comm, options, open);
}

}  // namespace dslaunch::worker::gpu
