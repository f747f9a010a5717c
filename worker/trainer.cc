#include "worker/trainer.h"

#include <omp.h>  // omp_get_max_threads

#include <algorithm>
#include <chrono>
#include <cmath>
#include <csignal>  // SIGTERM
#include <cstdio>
#include <cstdlib>  // getenv

#include "base/exit_status.h"  // SignalName
#include "worker/checkpoint.h"
#include "worker/cpu_adam.h"
#include "worker/lr_schedule.h"
#include "worker/partition.h"
#include "worker/stop_signal.h"

namespace dslaunch::worker {

Trainer::Trainer(const TrainConfig& config, std::unique_ptr<Comm> comm)
    : config_(config), comm_(std::move(comm)) {}

StatusOr<std::unique_ptr<Trainer>> Trainer::Create(
    const TrainConfig& config, std::unique_ptr<Comm> comm,
    const TrainOptions& options) {
  if (options.device == DeviceKind::kCuda) {
    if (config.zero.stage != 0) {
      return InvalidArgument(
          "zero_optimization.stage " + std::to_string(config.zero.stage) +
          ": the GPU engine trains stage 0 so far; use stage 0 or --device "
          "cpu");
    }
    if (config.fp16.enabled) {
      return InvalidArgument(
          "fp16: the GPU engine trains in fp32 or bf16 so far");
    }
  } else if (config.fp16.enabled || config.bf16) {
    return InvalidArgument("fp16/bf16: the CPU engine trains in fp32");
  }
  std::unique_ptr<Trainer> t(new Trainer(config, std::move(comm)));
  RETURN_IF_ERROR(t->Init(options));
  return t;
}

Status Trainer::Init(const TrainOptions& options) {
  const ModelSection& m = config_.model;
  ModelConfig mc =
      ModelConfig::Make(m.seq_len, m.vocab_size, m.n_layer, m.n_head, m.n_embd);
  RETURN_IF_ERROR(mc.Validate());
  const int world = comm_->size(), rank = comm_->rank();
  if (config_.zero.stage >= 2) {
    RETURN_IF_ERROR(InitSharded(mc, options));
  } else {
    if (!options.init_model.empty()) {
      ASSIGN_OR_RETURN(model_, ReadModelFile(options.init_model));
    } else {
      ASSIGN_OR_RETURN(model_, Model::Create(mc));
      model_->InitParams(config_.train.seed);
    }
    // Every rank holds whole parameters and gradients (stages 0 and 1),
    // padded so the gradients split evenly for the reduce-scatter.
    const Partition part = MakePartition(model_->layout().num_params(), world);
    model_->PadFlatBuffers(part.padded());
    shard_begin_ = config_.zero.stage == 0 ? 0 : part.begin(rank);
    shard_size_ =
        config_.zero.stage == 0 ? model_->layout().num_params() : part.shard;
    m_.assign(shard_size_, 0.0f);
    v_.assign(shard_size_, 0.0f);
  }
  DataLoaderOptions d;
  d.pattern = config_.data.train;
  d.batch_size = config_.batch.micro_batch_per_gpu;
  d.seq_len = m.seq_len;
  d.rank = rank;
  d.world_size = world;
  d.shuffle = config_.data.shuffle;
  d.seed = config_.train.seed;
  d.vocab_size = m.vocab_size;
  ASSIGN_OR_RETURN(train_, DataLoader::Open(d));
  if (!config_.data.val.empty()) {
    d.pattern = config_.data.val;
    d.shuffle = false;
    ASSIGN_OR_RETURN(val_, DataLoader::Open(d));
  }
  ASSIGN_OR_RETURN(tensorboard_, TensorBoardMonitor::Open(config_, rank));
  if (options.device == DeviceKind::kCuda) RETURN_IF_ERROR(InitDevice(options));
  RETURN_IF_ERROR(MaybeResume());
  if (engine_ && !config_.checkpoint.resume.empty()) {
    RETURN_IF_ERROR(PushToDevice());
  }
  return Status::Ok();
}

Status Trainer::InitDevice(const TrainOptions& options) {
  const ParamLayout& layout = model_->layout();
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
  o.precision = config_.bf16 ? DevicePrecision::kBf16
                : tf32 != nullptr && std::string(tf32) == "1"
                    ? DevicePrecision::kTf32
                    : DevicePrecision::kFp32;
  ASSIGN_OR_RETURN(engine_, OpenCudaEngine(o));
  return PushToDevice();
}

Status Trainer::Device(bool ok) const {
  if (ok) return Status::Ok();
  return Internal("GPU: " + engine_->error());
}

Status Trainer::PushToDevice() {
  RETURN_IF_ERROR(Device(engine_->SetParams(model_->params().data())));
  return Device(engine_->SetMoments(m_.data(), v_.data()));
}

Status Trainer::PullFromDevice() {
  if (!engine_) return Status::Ok();
  RETURN_IF_ERROR(Device(engine_->GetParams(model_->params().data())));
  return Device(engine_->GetMoments(m_.data(), v_.data()));
}

// Stage 0 on the GPU: the same step as the CPU's, with the gradients summed
// across ranks through host memory (Gloo) when there are several.
StatusOr<StepResult> Trainer::DeviceStep() {
  RETURN_IF_ERROR(Device(engine_->ZeroGrad()));
  const int gas = config_.batch.gradient_accumulation_steps;
  float loss = 0;
  for (int micro = 0; micro < gas; ++micro) {
    const Batch& b = train_->NextBatch();
    float l = 0;
    RETURN_IF_ERROR(Device(engine_->TrainMicroBatch(
        b.inputs.data(), b.targets.data(), b.batch_size, b.seq_len,
        1.0f / static_cast<float>(gas), &l)));
    loss += l;
  }
  loss /= static_cast<float>(gas);
  StepResult r;
  if (comm_->size() > 1) {
    RETURN_IF_ERROR(Device(engine_->GetGrads(model_->grads().data())));
    RETURN_IF_ERROR(ReduceGradients());
    RETURN_IF_ERROR(Device(engine_->SetGrads(model_->grads().data())));
  }
  double squares = 0;
  RETURN_IF_ERROR(Device(engine_->GradSquaredSum(&squares)));
  r.grad_norm = static_cast<float>(std::sqrt(squares));
  r.loss = loss;
  return r;
}

Status Trainer::InitSharded(const ModelConfig& mc,
                            const TrainOptions& options) {
  if (!options.init_model.empty()) {
    ASSIGN_OR_RETURN(
        model_, ReadModelFile(options.init_model, ParamOrder::kLayerMajor));
  } else {
    ASSIGN_OR_RETURN(model_, Model::Create(mc, ParamOrder::kLayerMajor));
  }
  zero_ =
      std::make_unique<ZeroState>(model_->layout(), config_.zero.stage,
                                  comm_.get(), config_.zero.reduce_bucket_size);
  if (options.init_model.empty()) {
    zero_->InitParams(config_.train.seed);
  } else {
    zero_->LoadParams(model_->params());
  }
  model_->set_hooks(zero_->Hooks());
  model_->set_param_source(zero_.get());  // the model's own buffers go
  return Status::Ok();
}

Status Trainer::MaybeResume() {
  const CheckpointConfig& c = config_.checkpoint;
  if (c.resume.empty()) return Status::Ok();
  std::string dir = c.resume;
  if (c.resume == "latest") {
    auto latest = LatestCheckpoint(c.dir);
    if (!latest) return Status::Ok();  // nothing saved yet: a fresh start
    dir = *latest;
  }
  ASSIGN_OR_RETURN(CheckpointState s, ReadCheckpointState(dir));
  const size_t n = model_->layout().num_params();
  if (!(s.model == model_->config()) || s.num_params != n) {
    return DataError(dir +
                     ": the checkpoint's model differs from the config's");
  }
  if (zero_) {
    RETURN_IF_ERROR(ResumeSharded(dir, n));
  } else {
    RETURN_IF_ERROR(
        ReadCheckpointRange(dir, "params", 0, model_->params().first(n)));
    RETURN_IF_ERROR(ResumeMoments(dir, n));
  }
  if (s.world_size != comm_->size())
    RETURN_IF_ERROR(KeepGlobalBatch(dir, s.train_batch_size));
  RETURN_IF_ERROR(train_->Restore(s.loader));
  step_ = s.step;
  if (comm_->rank() == 0) {
    std::printf("resumed from %s at step %lld\n", dir.c_str(),
                static_cast<long long>(step_));
  }
  return Status::Ok();
}

// On another world size (a restart with fewer or more nodes) the global
// batch goes on as the checkpoint had it, through the accumulation steps:
// the micro-batch stays, so memory per rank does too. A train_batch_size the
// config gives is the user's choice and stays; at the same world size the
// config is taken as it is (a changed micro-batch or accumulation is the
// user's choice too).
Status Trainer::KeepGlobalBatch(const std::string& dir, int64_t saved) {
  BatchConfig& b = config_.batch;
  if (saved <= 0 || saved == b.train_batch_size ||
      b.given_train_batch_size.has_value())
    return Status::Ok();
  const int64_t per_step =
      static_cast<int64_t>(b.micro_batch_per_gpu) * comm_->size();
  if (saved % per_step != 0) {
    return DataError(
        dir + ": the checkpoint's global batch " + std::to_string(saved) +
        " is not divisible by train_micro_batch_size_per_gpu " +
        std::to_string(b.micro_batch_per_gpu) + " * world_size " +
        std::to_string(comm_->size()) +
        "; set train_batch_size to go on with another global batch");
  }
  const int accumulation = static_cast<int>(saved / per_step);
  if (comm_->rank() == 0) {
    std::printf(
        "keeping the checkpoint's global batch %lld at world size %d: "
        "gradient_accumulation_steps %d (was %d)\n",
        static_cast<long long>(saved), comm_->size(), accumulation,
        b.gradient_accumulation_steps);
  }
  b.gradient_accumulation_steps = accumulation;
  b.train_batch_size = static_cast<int>(saved);
  return Status::Ok();
}

// Checkpoints keep llm.c's order; stages 2 and 3 train in kLayerMajor.
static std::vector<float> Reorder(const ParamLayout& from,
                                  std::span<const float> src,
                                  const ParamLayout& to) {
  std::vector<float> dst(to.num_params());
  for (const TensorInfo& t : from.Tensors()) {
    const ParamRange r = to.Range(t.kind, t.layer < 0 ? 0 : t.layer);
    std::copy(src.begin() + t.range.begin, src.begin() + t.range.end,
              dst.begin() + r.begin);
  }
  return dst;
}

Status Trainer::ResumeSharded(const std::string& dir, size_t n) {
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

Status Trainer::ResumeMoments(const std::string& dir, size_t n) {
  const size_t real =
      shard_begin_ >= n ? 0 : std::min(shard_size_, n - shard_begin_);
  std::fill(m_.begin(), m_.end(), 0.0f);
  std::fill(v_.begin(), v_.end(), 0.0f);
  RETURN_IF_ERROR(
      ReadCheckpointRange(dir, "m", shard_begin_, std::span(m_).first(real)));
  return ReadCheckpointRange(dir, "v", shard_begin_, std::span(v_).first(real));
}

StatusOr<std::vector<float>> Trainer::WholeParams() {
  RETURN_IF_ERROR(PullFromDevice());
  const size_t n = model_->layout().num_params();
  if (!zero_) {
    auto p = model_->params().first(n);
    return std::vector<float>(p.begin(), p.end());
  }
  ASSIGN_OR_RETURN(std::vector<float> full,
                   zero_->GatherAll(ZeroState::Which::kParams));
  return Reorder(model_->layout(), full,
                 ParamLayout(model_->config(), ParamOrder::kLlmc));
}

Status Trainer::Save() {
  RETURN_IF_ERROR(PullFromDevice());
  const size_t n = model_->layout().num_params();
  const Partition part = MakePartition(n, comm_->size());
  const int rank = comm_->rank();
  RankShard shard;
  shard.begin = part.begin(rank);
  const size_t count = part.real(rank);
  std::vector<std::vector<float>> whole;  // stages 2, 3: gathered, llm.c order
  if (zero_) {
    const ParamLayout llmc(model_->config(), ParamOrder::kLlmc);
    for (auto which : {ZeroState::Which::kParams, ZeroState::Which::kM,
                       ZeroState::Which::kV}) {
      ASSIGN_OR_RETURN(std::vector<float> full, zero_->GatherAll(which));
      whole.push_back(Reorder(model_->layout(), full, llmc));
    }
    shard.params = std::span<const float>(whole[0].data() + shard.begin, count);
    shard.m = std::span<const float>(whole[1].data() + shard.begin, count);
    shard.v = std::span<const float>(whole[2].data() + shard.begin, count);
  } else {
    // The moments this rank holds start at shard_begin_ (0 for stage 0).
    const size_t m_off = shard.begin - shard_begin_;
    shard.params =
        std::span<const float>(model_->params().data() + shard.begin, count);
    shard.m = std::span<const float>(m_.data() + m_off, count);
    shard.v = std::span<const float>(v_.data() + m_off, count);
  }
  CheckpointState s;
  s.step = step_;
  s.num_params = n;
  s.loader = train_->state();
  s.model = model_->config();
  s.train_batch_size = config_.batch.train_batch_size;
  ASSIGN_OR_RETURN(std::string dir,
                   SaveCheckpoint(config_.checkpoint.dir, s, shard,
                                  config_.checkpoint.keep, *comm_));
  if (rank == 0) std::printf("saved checkpoint %s\n", dir.c_str());
  return Status::Ok();
}

int64_t Trainer::model_state_bytes() const {
  if (engine_) return engine_->state_bytes();
  if (zero_) return zero_->state_bytes();
  const int64_t n = static_cast<int64_t>(model_->params().size());
  return 4 * (n + static_cast<int64_t>(model_->grads().size())) +
         4 * static_cast<int64_t>(m_.size() + v_.size());
}

Status Trainer::ReduceGradients() {
  const int world = comm_->size();
  float* g = model_->grads().data();
  if (world == 1) return Status::Ok();
  const float scale = 1.0f / static_cast<float>(world);
  if (config_.zero.stage == 0) {
    const size_t n = model_->layout().num_params();
    RETURN_IF_ERROR(comm_->AllReduceSum(g, n));
    for (size_t i = 0; i < n; ++i) g[i] *= scale;
    return Status::Ok();
  }
  // Stage 1: only this rank's part of the reduced gradients is needed.
  RETURN_IF_ERROR(comm_->ReduceScatterSum(g, g + shard_begin_, shard_size_));
  for (size_t i = 0; i < shard_size_; ++i) g[shard_begin_ + i] *= scale;
  return Status::Ok();
}

StatusOr<float> Trainer::GlobalGradNorm() {
  const float* g = model_->grads().data() + shard_begin_;
  const size_t real = std::min(
      shard_size_, model_->layout().num_params() -
                       std::min(shard_begin_, model_->layout().num_params()));
  double sum = 0;
#pragma omp parallel for reduction(+ : sum)
  for (size_t i = 0; i < real; ++i) sum += static_cast<double>(g[i]) * g[i];
  if (config_.zero.stage > 0 && comm_->size() > 1) {
    float partial = static_cast<float>(sum);
    RETURN_IF_ERROR(comm_->AllReduceSum(&partial, 1));
    sum = partial;
  }
  return static_cast<float>(std::sqrt(sum));
}

Status Trainer::UpdateParameters(double lr, float clip_scale) {
  float* p = model_->params().data();
  float* g = model_->grads().data();
  if (clip_scale != 1.0f) {
    for (size_t i = 0; i < shard_size_; ++i) g[shard_begin_ + i] *= clip_scale;
  }
  const AdamParams a = Adam(lr);
  const size_t lo = shard_begin_, hi = shard_begin_ + shard_size_;
  for (const DecaySegment& seg : model_->layout().DecaySegments()) {
    const size_t b = std::max(lo, seg.range.begin),
                 e = std::min(hi, seg.range.end);
    if (b >= e) continue;
    AdamStep(p + b, g + b, m_.data() + (b - lo), v_.data() + (b - lo), e - b, a,
             seg.decay);
  }
  if (config_.zero.stage == 1 && comm_->size() > 1) {
    gather_in_.assign(p + shard_begin_,
                      p + shard_begin_ + shard_size_);  // no realloc
    RETURN_IF_ERROR(comm_->AllGather(gather_in_.data(), p, shard_size_));
  }
  return Status::Ok();
}

AdamParams Trainer::Adam(double lr) const {
  AdamParams a;
  a.lr = lr;
  a.beta1 = config_.optimizer.beta1;
  a.beta2 = config_.optimizer.beta2;
  a.eps = config_.optimizer.eps;
  a.weight_decay = config_.optimizer.weight_decay;
  a.adamw_mode = config_.optimizer.decoupled_weight_decay();
  a.step = step_;
  return a;
}

StatusOr<StepResult> Trainer::Step() {
  ++step_;
  StepResult r;
  float loss = 0;
  if (engine_) {
    ASSIGN_OR_RETURN(r, DeviceStep());
    loss = r.loss;
  } else if (zero_) {
    zero_->ZeroGrad();
  } else {
    model_->ZeroGrad();
  }
  const int gas = config_.batch.gradient_accumulation_steps;
  for (int micro = 0; !engine_ && micro < gas; ++micro) {
    const Batch& b = train_->NextBatch();
    loss += model_->Forward(b.inputs.data(), b.targets.data(), b.batch_size,
                            b.seq_len);
    model_->Backward(1.0f / static_cast<float>(gas));
  }
  if (!engine_) loss /= static_cast<float>(gas);
  if (zero_) {
    ASSIGN_OR_RETURN(r.grad_norm,
                     zero_->FinishGradients());  // reduced layer by layer
  } else if (!engine_) {
    RETURN_IF_ERROR(ReduceGradients());
    ASSIGN_OR_RETURN(r.grad_norm, GlobalGradNorm());
  }
  const double clip = config_.gradient_clipping;
  const float clip_scale = clip > 0 && r.grad_norm > clip
                               ? static_cast<float>(clip / (r.grad_norm + 1e-6))
                               : 1.0f;
  r.lr =
      LearningRate(config_, step_ - 1);  // DeepSpeed steps its scheduler after
  if (engine_) {
    const AdamParams a = Adam(r.lr);
    RETURN_IF_ERROR(Device(engine_->AdamStep(
        {a.lr, a.beta1, a.beta2, a.eps, a.weight_decay, a.adamw_mode, a.step},
        clip_scale)));
  } else if (zero_) {
    RETURN_IF_ERROR(zero_->Update(Adam(r.lr), clip_scale));
  } else {
    RETURN_IF_ERROR(UpdateParameters(r.lr, clip_scale));
  }
  // The stop signal rides on the loss: every rank learns that some rank
  // got one at the same step, and all stop after it.
  float sums[2] = {loss, StopSignal() != 0 ? 1.0f : 0.0f};
  if (comm_->size() > 1) {
    RETURN_IF_ERROR(comm_->AllReduceSum(sums, 2));
    sums[0] /= static_cast<float>(comm_->size());
  }
  r.loss = sums[0];
  if (sums[1] > 0) r.stop_signal = StopSignal() != 0 ? StopSignal() : SIGTERM;
  return r;
}

StatusOr<float> Trainer::Evaluate(int batches) {
  if (!val_) return InvalidArgument("no data.val shard to evaluate on");
  val_->Reset();
  float loss = 0;
  for (int i = 0; i < batches; ++i) {
    const Batch& b = val_->NextBatch();
    if (engine_) {
      float l = 0;
      RETURN_IF_ERROR(Device(engine_->EvalBatch(
          b.inputs.data(), b.targets.data(), b.batch_size, b.seq_len, &l)));
      loss += l;
    } else {
      loss += model_->Forward(b.inputs.data(), b.targets.data(), b.batch_size,
                              b.seq_len);
    }
  }
  loss /= static_cast<float>(batches);
  if (comm_->size() > 1) {
    RETURN_IF_ERROR(comm_->AllReduceSum(&loss, 1));
    loss /= static_cast<float>(comm_->size());
  }
  return loss;
}

// "  gpu_mem 7.31 GiB" (the engine's allocator peak), or nothing on the CPU.
std::string Trainer::GpuMemoryNote() const {
  if (!engine_) return "";
  char text[48];
  std::snprintf(text, sizeof text, "  gpu_mem %.2f GiB",
                static_cast<double>(engine_->peak_memory_bytes()) / (1 << 30));
  return text;
}

std::string Trainer::Summary() const {
  const BatchConfig& b = config_.batch;
  const int ranks = comm_->size(), threads = omp_get_max_threads();
  std::string buckets;
  if (zero_) {
    const int n = zero_->num_buckets();
    buckets =
        " (" + std::to_string(n) + " gradient bucket" + (n == 1 ? ")" : "s)");
  }
  char line[320];
  std::snprintf(
      line, sizeof line,
      "train: %.2fM parameters, ZeRO stage %d on %d rank%s%s, batch %d = "
      "%d micro x %d accumulation x %d rank%s, seq %d, %d thread%s per rank",
      static_cast<double>(model_->layout().num_params()) / 1e6,
      config_.zero.stage, ranks, ranks == 1 ? "" : "s", buckets.c_str(),
      b.train_batch_size, b.micro_batch_per_gpu, b.gradient_accumulation_steps,
      ranks, ranks == 1 ? "" : "s", config_.model.seq_len, threads,
      threads == 1 ? "" : "s");
  if (engine_) return std::string(line) + "; GPU " + engine_->Describe();
  return line;
}

StatusOr<StepResult> Trainer::Run() {
  StepResult last;
  if (comm_->rank() == 0) std::printf("%s\n", Summary().c_str());
  const int every = std::max(1, config_.steps_per_print);
  const int64_t tokens_per_step =
      static_cast<int64_t>(config_.batch.train_batch_size) *
      config_.model.seq_len;
  auto t0 = std::chrono::steady_clock::now();
  const int64_t save_every =
      config_.checkpoint.dir.empty() ? 0 : config_.checkpoint.every;
  while (step_ < config_.train.steps) {
    ASSIGN_OR_RETURN(last, Step());
    tensorboard_->StepDone(step_, config_.batch.train_batch_size, last.loss,
                           LearningRate(config_, step_));
    // Asked to stop in the last step: the training is done anyway.
    if (step_ == config_.train.steps) last.stop_signal = 0;
    const bool stopping = last.stop_signal != 0;
    if (stopping) NoteStopAgreed();  // the save may take its time
    const bool saved = save_every > 0 && step_ % save_every == 0;
    if (saved || (stopping && !config_.checkpoint.dir.empty()))
      RETURN_IF_ERROR(Save());
    if (stopping && comm_->rank() == 0) {
      std::printf(
          "stopping after step %lld (%s)%s\n", static_cast<long long>(step_),
          SignalName(last.stop_signal).c_str(),
          config_.checkpoint.dir.empty() ? "; no checkpoint.dir, nothing saved"
                                         : "; checkpoint saved");
      std::fflush(stdout);
    }
    NoteStepDone();
    const int64_t s = step_ - 1;
    if (!stopping && step_ % every != 0 && s + 1 != config_.train.steps)
      continue;
    const auto t1 = std::chrono::steady_clock::now();
    const double dt = std::chrono::duration<double>(t1 - t0).count();
    const int steps =
        static_cast<int>(step_ % every == 0 ? every : step_ % every);
    t0 = t1;
    StepReport rep{
        step_,
        last.loss,
        last.lr,
        last.grad_norm,
        tokens_per_step * steps / dt,
        static_cast<double>(config_.batch.train_batch_size) * steps / dt,
        model_state_bytes(),
        config_.train.steps};
    progress_.Report(rep);
    // Under dslaunch the record is the console's to show (once); a line of
    // our own only where nobody receives it.
    if (comm_->rank() == 0 && !progress_.connected()) {
      std::printf(
          "step %6lld  loss %.6f  lr %.3e  grad_norm %.4f  %.0f tok/s%s\n",
          static_cast<long long>(step_), last.loss, last.lr, last.grad_norm,
          rep.tokens_per_s, GpuMemoryNote().c_str());
      std::fflush(stdout);
    }
    if (stopping) return last;  // its record is out; no evaluation now
    if (config_.train.eval_every > 0 && step_ % config_.train.eval_every == 0 &&
        val_) {
      ASSIGN_OR_RETURN(float val, Evaluate(4));
      if (comm_->rank() == 0)
        std::printf("step %6lld  val_loss %.6f\n",
                    static_cast<long long>(step_), val);
    }
  }
  return last;
}

}  // namespace dslaunch::worker
