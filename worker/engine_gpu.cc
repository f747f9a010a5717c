// The GPU engine: ZeRO stages 0-2 on a DeviceEngine (worker/device_engine.h,
// the CUDA one in libdsl_cuda.so), with the optimizer on the device or
// offloaded to the CPU (offload_optimizer: {device: cpu}). The host keeps a
// Model and a ReplicatedState for what passes through host memory: the
// initial parameters, checkpoints, the gradients reduced across ranks over
// Gloo when there are several, and, offloaded, the fp32 master parameters
// and the AdamW moments the CPU updates.
//
// Stage 1 (and 2, which keeps stage 1's law here: the device holds whole
// gradients for its backward pass) reduce-scatters the gradients; each rank
// updates its shard, on the device where only that shard's moments are, or
// on the host, and the parameters are all-gathered.
#include <algorithm>
#include <cmath>
#include <cstdlib>

#include "worker/device_engine.h"
#include "worker/engine.h"
#include "worker/model.h"
#include "worker/replicated_state.h"

namespace dslaunch::worker {
namespace {

class GpuEngine final : public Engine {
 public:
  explicit GpuEngine(Comm* comm) : comm_(comm) {}

  Status Init(const TrainConfig& config, const EngineOptions& options,
              const DeviceOpener& open) {
    if (!options.init_model.empty()) {
      ASSIGN_OR_RETURN(host_, ReadModelFile(options.init_model));
    } else {
      const ModelSection& m = config.model;
      ASSIGN_OR_RETURN(
          host_, Model::Create(ModelConfig::Make(
                     m.seq_len, m.vocab_size, m.n_layer, m.n_head, m.n_embd)));
      host_->InitParams(config.train.seed);
    }
    // Stage 2 keeps the law of stage 1 here: the device holds whole
    // gradients for its backward pass either way.
    stage_ = std::min(config.zero.stage, 1);
    offload_ = config.zero.offload_optimizer == OffloadDevice::kCpu;
    state_ = std::make_unique<ReplicatedState>(host_.get(), stage_, comm_);
    const ParamLayout& layout = host_->layout();
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
    for (int k = 0; k < kNumParamKinds; ++k)
      s.offset[k] = layout.Offset(static_cast<ParamKind>(k), 0);
    for (const DecaySegment& seg : layout.DecaySegments())
      s.segments.push_back({seg.range.begin, seg.range.end, seg.decay});
    o.moments_begin = state_->shard_begin();
    o.moments_count = offload_ ? 0 : state_->shard_real();
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
    ASSIGN_OR_RETURN(dev_, open(o));
    return Push();
  }

  const ModelConfig& model_config() const override { return host_->config(); }
  size_t num_params() const override { return host_->layout().num_params(); }

  Status ZeroGrad() override { return Ok(dev_->ZeroGrad()); }
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

  StatusOr<float> FinishGradients() override {
    if (!ThroughHost()) {
      // One rank, the optimizer on the device: nothing leaves it.
      double squares = 0;
      RETURN_IF_ERROR(Ok(dev_->GradSquaredSum(&squares)));
      return static_cast<float>(std::sqrt(squares));
    }
    float* g = host_->grads().data();
    RETURN_IF_ERROR(Ok(dev_->GetGrads(g)));
    ASSIGN_OR_RETURN(float norm, state_->FinishGradients());
    // The device's optimizer steps on the reduced gradients of its part.
    if (!offload_) RETURN_IF_ERROR(Ok(dev_->SetGrads(g)));
    return norm;
  }

  Status Update(const AdamParams& a, float clip_scale) override {
    if (offload_) {
      // ZeRO-Offload: AdamW on the host's fp32 master parameters (this
      // rank's shard under stage 1), the updated whole back to the device.
      RETURN_IF_ERROR(state_->Update(a, clip_scale));
      return Ok(dev_->SetParams(host_->params().data()));
    }
    RETURN_IF_ERROR(Ok(dev_->AdamStep(
        {a.lr, a.beta1, a.beta2, a.eps, a.weight_decay, a.adamw_mode, a.step},
        clip_scale)));
    if (stage_ == 0 || comm_->size() == 1) return Status::Ok();
    // Stage 1: each rank updated its shard; every rank needs all of them.
    float* p = host_->params().data();
    RETURN_IF_ERROR(Ok(dev_->GetParams(p)));
    RETURN_IF_ERROR(state_->GatherParams());
    return Ok(dev_->SetParams(p));
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
  int64_t device_memory_bytes() const override {
    return dev_->peak_memory_bytes();
  }
  std::string Describe() const override {
    return "GPU " + dev_->Describe() +
           (offload_ ? ", optimizer offloaded to the CPU" : "");
  }

 private:
  Status Ok(bool ok) const {
    if (ok) return Status::Ok();
    return Internal("GPU: " + dev_->error());
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
    if (offload_) return Status::Ok();
    RETURN_IF_ERROR(Ok(dev_->GetParams(host_->params().data())));
    return Ok(dev_->GetMoments(state_->m().data(), state_->v().data()));
  }

  Comm* comm_;
  int stage_ = 0;
  bool offload_ = false;
  std::unique_ptr<Model> host_;
  std::unique_ptr<ReplicatedState> state_;
  std::unique_ptr<DeviceEngine> dev_;
};

}  // namespace

StatusOr<std::unique_ptr<Engine>> MakeGpuEngine(const TrainConfig& config,
                                                Comm* comm,
                                                const EngineOptions& options,
                                                const DeviceOpener& open) {
  if (config.zero.stage > 2) {
    return InvalidArgument(
        "zero_optimization.stage 3: the GPU engine trains stages 0-2 so far; "
        "use stage 2 (with offload_optimizer for the most memory) or "
        "--device cpu");
  }
  auto e = std::make_unique<GpuEngine>(comm);
  RETURN_IF_ERROR(e->Init(config, options, open));
  return std::unique_ptr<Engine>(std::move(e));
}

}  // namespace dslaunch::worker
