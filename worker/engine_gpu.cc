// The GPU engine: ZeRO stage 0 on a DeviceEngine (worker/device_engine.h,
// the CUDA one in libdsl_cuda.so). The host keeps a Model only for what
// passes through host memory: the initial parameters, checkpoints, and the
// gradients summed across ranks over Gloo when there are several.
#include <cmath>
#include <cstdlib>

#include "worker/device_engine.h"
#include "worker/engine.h"
#include "worker/model.h"

namespace dslaunch::worker {
namespace {

class GpuEngine final : public Engine {
 public:
  explicit GpuEngine(Comm* comm) : comm_(comm) {}

  Status Init(const TrainConfig& config, const EngineOptions& options) {
    if (!options.init_model.empty()) {
      ASSIGN_OR_RETURN(host_, ReadModelFile(options.init_model));
    } else {
      const ModelSection& m = config.model;
      ASSIGN_OR_RETURN(
          host_, Model::Create(ModelConfig::Make(
                     m.seq_len, m.vocab_size, m.n_layer, m.n_head, m.n_embd)));
      host_->InitParams(config.train.seed);
    }
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
    ASSIGN_OR_RETURN(dev_, OpenCudaEngine(o));
    m_.assign(num_params(), 0.0f);
    v_.assign(num_params(), 0.0f);
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
    const int world = comm_->size();
    if (world > 1) {
      float* g = host_->grads().data();
      const size_t n = num_params();
      RETURN_IF_ERROR(Ok(dev_->GetGrads(g)));
      RETURN_IF_ERROR(comm_->AllReduceSum(g, n));
      const float scale = 1.0f / static_cast<float>(world);
      for (size_t i = 0; i < n; ++i) g[i] *= scale;
      RETURN_IF_ERROR(Ok(dev_->SetGrads(g)));
    }
    double squares = 0;
    RETURN_IF_ERROR(Ok(dev_->GradSquaredSum(&squares)));
    return static_cast<float>(std::sqrt(squares));
  }

  Status Update(const AdamParams& a, float clip_scale) override {
    return Ok(dev_->AdamStep(
        {a.lr, a.beta1, a.beta2, a.eps, a.weight_decay, a.adamw_mode, a.step},
        clip_scale));
  }

  StatusOr<RankShard> CheckpointRange(size_t begin, size_t count) override {
    RETURN_IF_ERROR(Ok(dev_->GetParams(host_->params().data())));
    RETURN_IF_ERROR(Ok(dev_->GetMoments(m_.data(), v_.data())));
    RankShard shard;
    shard.begin = begin;
    shard.params =
        std::span<const float>(host_->params().data() + begin, count);
    shard.m = std::span<const float>(m_.data() + begin, count);
    shard.v = std::span<const float>(v_.data() + begin, count);
    return shard;
  }

  Status Resume(const std::string& dir) override {
    const size_t n = num_params();
    RETURN_IF_ERROR(
        ReadCheckpointRange(dir, "params", 0, host_->params().first(n)));
    RETURN_IF_ERROR(ReadCheckpointRange(dir, "m", 0, m_));
    RETURN_IF_ERROR(ReadCheckpointRange(dir, "v", 0, v_));
    return Push();
  }

  StatusOr<std::vector<float>> WholeParams() override {
    RETURN_IF_ERROR(Ok(dev_->GetParams(host_->params().data())));
    auto p = host_->params().first(num_params());
    return std::vector<float>(p.begin(), p.end());
  }

  int64_t state_bytes() const override { return dev_->state_bytes(); }
  int64_t device_memory_bytes() const override {
    return dev_->peak_memory_bytes();
  }
  std::string Describe() const override { return "GPU " + dev_->Describe(); }

 private:
  Status Ok(bool ok) const {
    if (ok) return Status::Ok();
    return Internal("GPU: " + dev_->error());
  }
  Status Push() {
    RETURN_IF_ERROR(Ok(dev_->SetParams(host_->params().data())));
    return Ok(dev_->SetMoments(m_.data(), v_.data()));
  }

  Comm* comm_;
  std::unique_ptr<Model> host_;
  std::unique_ptr<DeviceEngine> dev_;
  std::vector<float> m_, v_;  // host copies, for checkpoints
};

}  // namespace

StatusOr<std::unique_ptr<Engine>> MakeGpuEngine(const TrainConfig& config,
                                                Comm* comm,
                                                const EngineOptions& options) {
  if (config.zero.stage != 0) {
    return InvalidArgument(
        "zero_optimization.stage " + std::to_string(config.zero.stage) +
        ": the GPU engine trains stage 0 so far; use stage 0 or --device cpu");
  }
  auto e = std::make_unique<GpuEngine>(comm);
  RETURN_IF_ERROR(e->Init(config, options));
  return std::unique_ptr<Engine>(std::move(e));
}

}  // namespace dslaunch::worker
