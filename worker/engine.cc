#include "worker/engine.h"

#include <algorithm>
#include <cmath>

#include "worker/model.h"
#include "worker/replicated_state.h"
#include "worker/zero_state.h"

namespace dslaunch::worker {
namespace {

ModelConfig ConfigModel(const TrainConfig& config) {
  const ModelSection& m = config.model;
  return ModelConfig::Make(m.seq_len, m.vocab_size, m.n_layer, m.n_head,
                           m.n_embd);
}

// ------------------------------------------------------------ on the CPU

// What both CPU engines do alike: the Model's forward and backward pass.
class CpuEngine : public Engine {
 public:
  const ModelConfig& model_config() const override { return model_->config(); }
  size_t num_params() const override { return model_->layout().num_params(); }
  StatusOr<float> TrainMicroBatch(const Batch& b, float grad_scale) override {
    const float loss = model_->Forward(b.inputs.data(), b.targets.data(),
                                       b.batch_size, b.seq_len);
    model_->Backward(grad_scale);
    return loss;
  }
  StatusOr<float> EvalBatch(const Batch& b) override {
    return model_->Forward(b.inputs.data(), b.targets.data(), b.batch_size,
                           b.seq_len);
  }

 protected:
  std::unique_ptr<Model> model_;
};

// ------------------------------------------------------------ replicated

// Stages 0 and 1 on the CPU: whole parameters and gradients on every rank,
// the optimizer's side in a ReplicatedState.
class ReplicatedEngine final : public CpuEngine {
 public:
  ReplicatedEngine(int stage, Comm* comm) : stage_(stage), comm_(comm) {}

  Status Init(const TrainConfig& config, const EngineOptions& options) {
    if (!options.init_model.empty()) {
      ASSIGN_OR_RETURN(model_, ReadModelFile(options.init_model));
    } else {
      ASSIGN_OR_RETURN(model_, Model::Create(ConfigModel(config)));
      model_->InitParams(config.train.seed);
    }
    state_ = std::make_unique<ReplicatedState>(model_.get(), stage_, comm_);
    return Status::Ok();
  }

  Status ZeroGrad() override {
    model_->ZeroGrad();
    return Status::Ok();
  }
  StatusOr<float> FinishGradients() override {
    return state_->FinishGradients();
  }
  Status Update(const AdamParams& adam, float clip_scale) override {
    return state_->Update(adam, clip_scale);
  }
  StatusOr<RankShard> CheckpointRange(size_t begin, size_t count) override {
    return state_->CheckpointRange(begin, count);
  }
  Status Resume(const std::string& dir) override { return state_->Resume(dir); }

  StatusOr<std::vector<float>> WholeParams() override {
    auto p = model_->params().first(num_params());
    return std::vector<float>(p.begin(), p.end());
  }

  int64_t state_bytes() const override {
    const int64_t n = static_cast<int64_t>(model_->params().size());
    return 4 * (n + static_cast<int64_t>(model_->grads().size())) +
           state_->moment_bytes();
  }
  std::string Describe() const override { return ""; }

 private:
  int stage_;
  Comm* comm_;
  std::unique_ptr<ReplicatedState> state_;
};

// ------------------------------------------------------------ sharded

// Stages 2 and 3 on the CPU: the Model reads its parameters and leaves its
// gradients through ZeroState (its ParamSource), layer by layer.
class ShardedEngine final : public CpuEngine {
 public:
  explicit ShardedEngine(Comm* comm) : comm_(comm) {}

  Status Init(const TrainConfig& config, const EngineOptions& options) {
    if (!options.init_model.empty()) {
      ASSIGN_OR_RETURN(
          model_, ReadModelFile(options.init_model, ParamOrder::kLayerMajor));
    } else {
      ASSIGN_OR_RETURN(
          model_, Model::Create(ConfigModel(config), ParamOrder::kLayerMajor));
    }
    zero_ = std::make_unique<ZeroState>(model_->layout(), config.zero.stage,
                                        comm_, config.zero.reduce_bucket_size);
    if (options.init_model.empty()) {
      zero_->InitParams(config.train.seed);
    } else {
      zero_->LoadParams(model_->params());
    }
    model_->set_hooks(zero_->Hooks());
    model_->set_param_source(zero_.get());  // the model's own buffers go
    return Status::Ok();
  }

  Status ZeroGrad() override {
    zero_->ZeroGrad();
    return Status::Ok();
  }
  // Reduced layer by layer during the backward pass already.
  StatusOr<float> FinishGradients() override {
    return zero_->FinishGradients();
  }
  Status Update(const AdamParams& adam, float clip_scale) override {
    return zero_->Update(adam, clip_scale);
  }

  StatusOr<RankShard> CheckpointRange(size_t begin, size_t count) override {
    return zero_->CheckpointRange(begin, count);
  }
  Status Resume(const std::string& dir) override { return zero_->Resume(dir); }
  StatusOr<std::vector<float>> WholeParams() override {
    return zero_->WholeParams();
  }

  int64_t state_bytes() const override { return zero_->state_bytes(); }
  std::string Describe() const override {
    const int n = zero_->num_buckets();
    return std::to_string(n) + " gradient bucket" + (n == 1 ? "" : "s");
  }

 private:
  Comm* comm_;
  std::unique_ptr<ZeroState> zero_;
};

}  // namespace

StatusOr<std::unique_ptr<Engine>> MakeEngine(const TrainConfig& config,
                                             Comm* comm,
                                             const EngineOptions& options) {
  RETURN_IF_ERROR(ConfigModel(config).Validate());
  if (options.device == DeviceKind::kCuda) {
    return MakeGpuEngine(config, comm, options);
  }
  if (config.fp16.enabled || config.bf16) {
    return InvalidArgument("fp16/bf16: the CPU engine trains in fp32");
  }
  if (config.zero.stage >= 2) {
    auto e = std::make_unique<ShardedEngine>(comm);
    RETURN_IF_ERROR(e->Init(config, options));
    return std::unique_ptr<Engine>(std::move(e));
  }
  auto e = std::make_unique<ReplicatedEngine>(config.zero.stage, comm);
  RETURN_IF_ERROR(e->Init(config, options));
  return std::unique_ptr<Engine>(std::move(e));
}

}  // namespace dslaunch::worker
