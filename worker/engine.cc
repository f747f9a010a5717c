#include "worker/engine.h"

#include <algorithm>
#include <cmath>

#include "worker/model.h"
#include "worker/partition.h"
#include "worker/zero_state.h"

namespace dslaunch::worker {
namespace {

// Checkpoints keep llm.c's order; stages 2 and 3 train in kLayerMajor.
std::vector<float> Reorder(const ParamLayout& from, std::span<const float> src,
                           const ParamLayout& to) {
  std::vector<float> dst(to.num_params());
  for (const TensorInfo& t : from.Tensors()) {
    const ParamRange r = to.Range(t.kind, t.layer < 0 ? 0 : t.layer);
    std::copy(src.begin() + t.range.begin, src.begin() + t.range.end,
              dst.begin() + r.begin);
  }
  return dst;
}

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

// Stages 0 and 1 on the CPU: whole parameters and gradients on every rank
// (padded so the gradients split evenly for the reduce-scatter); the moments
// of [shard_begin_, + shard_size_): everything under stage 0, this rank's
// piece under stage 1.
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
    const size_t n = num_params();
    const Partition part = MakePartition(n, comm_->size());
    model_->PadFlatBuffers(part.padded());
    shard_begin_ = stage_ == 0 ? 0 : part.begin(comm_->rank());
    shard_size_ = stage_ == 0 ? n : part.shard;
    m_.assign(shard_size_, 0.0f);
    v_.assign(shard_size_, 0.0f);
    return Status::Ok();
  }

  Status ZeroGrad() override {
    model_->ZeroGrad();
    return Status::Ok();
  }

  StatusOr<float> FinishGradients() override {
    RETURN_IF_ERROR(ReduceGradients());
    // The norm of the gradients this rank updates (stage 1: its piece,
    // summed over ranks).
    const float* g = model_->grads().data() + shard_begin_;
    const size_t n = num_params();
    const size_t real = std::min(shard_size_, n - std::min(shard_begin_, n));
    double sum = 0;
#pragma omp parallel for reduction(+ : sum)
    for (size_t i = 0; i < real; ++i) sum += static_cast<double>(g[i]) * g[i];
    if (stage_ > 0 && comm_->size() > 1) {
      float partial = static_cast<float>(sum);
      RETURN_IF_ERROR(comm_->AllReduceSum(&partial, 1));
      sum = partial;
    }
    return static_cast<float>(std::sqrt(sum));
  }

  Status Update(const AdamParams& adam, float clip_scale) override {
    float* p = model_->params().data();
    float* g = model_->grads().data();
    if (clip_scale != 1.0f) {
      for (size_t i = 0; i < shard_size_; ++i)
        g[shard_begin_ + i] *= clip_scale;
    }
    const size_t lo = shard_begin_, hi = shard_begin_ + shard_size_;
    for (const DecaySegment& seg : model_->layout().DecaySegments()) {
      const size_t b = std::max(lo, seg.range.begin),
                   e = std::min(hi, seg.range.end);
      if (b >= e) continue;
      AdamStep(p + b, g + b, m_.data() + (b - lo), v_.data() + (b - lo), e - b,
               adam, seg.decay);
    }
    if (stage_ == 1 && comm_->size() > 1) {
      gather_in_.assign(p + shard_begin_,
                        p + shard_begin_ + shard_size_);  // no realloc
      RETURN_IF_ERROR(comm_->AllGather(gather_in_.data(), p, shard_size_));
    }
    return Status::Ok();
  }

  StatusOr<RankShard> CheckpointRange(size_t begin, size_t count) override {
    // The moments this rank holds start at shard_begin_ (0 for stage 0); a
    // checkpoint's partition is this rank's stage-1 shard.
    RankShard shard;
    shard.begin = begin;
    const size_t m_off = begin - shard_begin_;
    shard.params =
        std::span<const float>(model_->params().data() + begin, count);
    shard.m = std::span<const float>(m_.data() + m_off, count);
    shard.v = std::span<const float>(v_.data() + m_off, count);
    return shard;
  }

  Status Resume(const std::string& dir) override {
    const size_t n = num_params();
    RETURN_IF_ERROR(
        ReadCheckpointRange(dir, "params", 0, model_->params().first(n)));
    const size_t real =
        shard_begin_ >= n ? 0 : std::min(shard_size_, n - shard_begin_);
    std::fill(m_.begin(), m_.end(), 0.0f);
    std::fill(v_.begin(), v_.end(), 0.0f);
    RETURN_IF_ERROR(
        ReadCheckpointRange(dir, "m", shard_begin_, std::span(m_).first(real)));
    return ReadCheckpointRange(dir, "v", shard_begin_,
                               std::span(v_).first(real));
  }

  StatusOr<std::vector<float>> WholeParams() override {
    auto p = model_->params().first(num_params());
    return std::vector<float>(p.begin(), p.end());
  }

  int64_t state_bytes() const override {
    const int64_t n = static_cast<int64_t>(model_->params().size());
    return 4 * (n + static_cast<int64_t>(model_->grads().size())) +
           4 * static_cast<int64_t>(m_.size() + v_.size());
  }
  std::string Describe() const override { return ""; }

 private:
  // Stage 0: every gradient averaged on every rank; stage 1: only this
  // rank's piece of the reduced gradients is needed.
  Status ReduceGradients() {
    const int world = comm_->size();
    if (world == 1) return Status::Ok();
    float* g = model_->grads().data();
    const float scale = 1.0f / static_cast<float>(world);
    if (stage_ == 0) {
      const size_t n = num_params();
      RETURN_IF_ERROR(comm_->AllReduceSum(g, n));
      for (size_t i = 0; i < n; ++i) g[i] *= scale;
      return Status::Ok();
    }
    RETURN_IF_ERROR(comm_->ReduceScatterSum(g, g + shard_begin_, shard_size_));
    for (size_t i = 0; i < shard_size_; ++i) g[shard_begin_ + i] *= scale;
    return Status::Ok();
  }

  int stage_;
  Comm* comm_;
  size_t shard_begin_ = 0, shard_size_ = 0;
  std::vector<float> m_, v_;
  std::vector<float> gather_in_;  // stage 1: own updated piece
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
    const ParamLayout llmc(model_->config(), ParamOrder::kLlmc);
    whole_.clear();
    for (auto which : {ZeroState::Which::kParams, ZeroState::Which::kM,
                       ZeroState::Which::kV}) {
      ASSIGN_OR_RETURN(std::vector<float> full, zero_->GatherAll(which));
      whole_.push_back(Reorder(model_->layout(), full, llmc));
    }
    RankShard shard;
    shard.begin = begin;
    shard.params = std::span<const float>(whole_[0].data() + begin, count);
    shard.m = std::span<const float>(whole_[1].data() + begin, count);
    shard.v = std::span<const float>(whole_[2].data() + begin, count);
    return shard;
  }

  Status Resume(const std::string& dir) override {
    const size_t n = num_params();
    const ParamLayout llmc(model_->config(), ParamOrder::kLlmc);
    std::vector<std::vector<float>> parts;
    for (const char* which : {"params", "m", "v"}) {
      std::vector<float> full(n);
      RETURN_IF_ERROR(ReadCheckpointRange(dir, which, 0, full));
      parts.push_back(Reorder(llmc, full, model_->layout()));
    }
    zero_->LoadState(parts[0], parts[1], parts[2]);
    return Status::Ok();
  }

  StatusOr<std::vector<float>> WholeParams() override {
    ASSIGN_OR_RETURN(std::vector<float> full,
                     zero_->GatherAll(ZeroState::Which::kParams));
    return Reorder(model_->layout(), full,
                   ParamLayout(model_->config(), ParamOrder::kLlmc));
  }

  int64_t state_bytes() const override { return zero_->state_bytes(); }
  std::string Describe() const override {
    const int n = zero_->num_buckets();
    return std::to_string(n) + " gradient bucket" + (n == 1 ? "" : "s");
  }

 private:
  Comm* comm_;
  std::unique_ptr<ZeroState> zero_;
  std::vector<std::vector<float>> whole_;  // a checkpoint's gathered state
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
