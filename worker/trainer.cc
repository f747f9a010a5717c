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
  std::unique_ptr<Trainer> t(new Trainer(config, std::move(comm)));
  RETURN_IF_ERROR(t->Init(options));
  return t;
}

Status Trainer::Init(const TrainOptions& options) {
  EngineOptions e;
  e.init_model = options.init_model;
  e.device = options.device;
  e.local_rank = options.local_rank;
  ASSIGN_OR_RETURN(engine_, options.make_engine
                                ? options.make_engine(config_, comm_.get(), e)
                                : MakeEngine(config_, comm_.get(), e));
  if (config_.fp16.enabled) scaler_.emplace(config_.fp16);
  DataLoaderOptions d;
  d.pattern = config_.data.train;
  d.batch_size = config_.batch.micro_batch_per_gpu;
  d.seq_len = config_.model.seq_len;
  d.rank = comm_->rank();
  d.world_size = comm_->size();
  d.shuffle = config_.data.shuffle;
  d.seed = config_.train.seed;
  d.vocab_size = config_.model.vocab_size;
  ASSIGN_OR_RETURN(train_, DataLoader::Open(d));
  if (!config_.data.val.empty()) {
    d.pattern = config_.data.val;
    d.shuffle = false;
    ASSIGN_OR_RETURN(val_, DataLoader::Open(d));
  }
  ASSIGN_OR_RETURN(tensorboard_,
                   TensorBoardMonitor::Open(config_, comm_->rank()));
  return MaybeResume();
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
  if (!(s.model == engine_->model_config()) ||
      s.num_params != engine_->num_params()) {
    return DataError(dir +
                     ": the checkpoint's model differs from the config's");
  }
  RETURN_IF_ERROR(engine_->Resume(dir));
  if (s.world_size != comm_->size())
    RETURN_IF_ERROR(KeepGlobalBatch(dir, s.train_batch_size));
  RETURN_IF_ERROR(train_->Restore(s.loader));
  step_ = s.step;
  // (What fp16 skipped before the checkpoint is not kept: its steps count
  // as applied from here, and the loss scale starts over.)
  applied_ = step_;
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

StatusOr<std::vector<float>> Trainer::WholeParams() {
  return engine_->WholeParams();
}

Status Trainer::Save() {
  const size_t n = engine_->num_params();
  const Partition part = MakePartition(n, comm_->size());
  const int rank = comm_->rank();
  ASSIGN_OR_RETURN(RankShard shard,
                   engine_->CheckpointRange(part.begin(rank), part.real(rank)));
  CheckpointState s;
  s.step = step_;
  s.num_params = n;
  s.loader = train_->state();
  s.model = engine_->model_config();
  s.train_batch_size = config_.batch.train_batch_size;
  ASSIGN_OR_RETURN(std::string dir,
                   SaveCheckpoint(config_.checkpoint.dir, s, shard,
                                  config_.checkpoint.keep, *comm_));
  if (rank == 0) std::printf("saved checkpoint %s\n", dir.c_str());
  return Status::Ok();
}

int64_t Trainer::model_state_bytes() const { return engine_->state_bytes(); }
int64_t Trainer::device_memory_bytes() const {
  return engine_->device_memory_bytes();
}

AdamParams Trainer::Adam(double lr) const {
  AdamParams a;
  a.lr = lr;
  a.beta1 = config_.optimizer.beta1;
  a.beta2 = config_.optimizer.beta2;
  a.eps = config_.optimizer.eps;
  a.weight_decay = config_.optimizer.weight_decay;
  a.adamw_mode = config_.optimizer.decoupled_weight_decay();
  a.step = applied_;
  return a;
}

StatusOr<StepResult> Trainer::Step() {
  ++step_;
  RETURN_IF_ERROR(engine_->ZeroGrad());
  const int gas = config_.batch.gradient_accumulation_steps;
  // fp16: the loss (so every gradient) times the scale, divided out below.
  const double scale = scaler_ ? scaler_->scale() : 1.0;
  const float grad_scale = scaler_ ? static_cast<float>(scale / gas)
                                   : 1.0f / static_cast<float>(gas);
  float loss = 0;
  for (int micro = 0; micro < gas; ++micro) {
    ASSIGN_OR_RETURN(float l,
                     engine_->TrainMicroBatch(train_->NextBatch(), grad_scale));
    loss += l;
  }
  loss /= static_cast<float>(gas);
  StepResult r;
  ASSIGN_OR_RETURN(r.grad_norm, engine_->FinishGradients());
  if (scaler_) {
    r.loss_scale = scale;
    r.skipped = !std::isfinite(r.grad_norm);
    RETURN_IF_ERROR(scaler_->Update(r.skipped));
    if (!r.skipped) r.grad_norm = static_cast<float>(r.grad_norm / scale);
  }
  // DeepSpeed steps its scheduler after the update: this one runs with the
  // rate of the steps applied before it.
  r.lr = LearningRate(config_, applied_);
  if (!r.skipped) {
    const double clip = config_.gradient_clipping;
    const double clip_scale =
        clip > 0 && r.grad_norm > clip ? clip / (r.grad_norm + 1e-6) : 1.0;
    ++applied_;
    RETURN_IF_ERROR(
        engine_->Update(Adam(r.lr), static_cast<float>(clip_scale / scale)));
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
    ASSIGN_OR_RETURN(float l, engine_->EvalBatch(val_->NextBatch()));
    loss += l;
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
  const int64_t bytes = engine_->device_memory_bytes();
  if (bytes == 0) return "";
  char text[48];
  std::snprintf(text, sizeof text, "  gpu_mem %.2f GiB",
                static_cast<double>(bytes) / (1 << 30));
  return text;
}

// "  loss_scale 65536 skipped 3" under fp16, else nothing.
std::string Trainer::ScaleNote() const {
  if (!scaler_) return "";
  char text[64];
  std::snprintf(text, sizeof text, "  loss_scale %g skipped %lld",
                scaler_->scale(),
                static_cast<long long>(scaler_->skipped_steps()));
  return text;
}

std::string Trainer::Summary() const {
  const BatchConfig& b = config_.batch;
  const int ranks = comm_->size(), threads = omp_get_max_threads();
  const std::string engine = engine_->Describe();
  char line[512];
  std::snprintf(
      line, sizeof line,
      "train: %.2fM parameters, ZeRO stage %d on %d rank%s%s, batch %d = "
      "%d micro x %d accumulation x %d rank%s, seq %d, %d thread%s per rank",
      static_cast<double>(engine_->num_params()) / 1e6, config_.zero.stage,
      ranks, ranks == 1 ? "" : "s",
      engine.empty() ? "" : (" (" + engine + ")").c_str(), b.train_batch_size,
      b.micro_batch_per_gpu, b.gradient_accumulation_steps, ranks,
      ranks == 1 ? "" : "s", config_.model.seq_len, threads,
      threads == 1 ? "" : "s");
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
        config_.train.steps,
        engine_->device_memory_bytes() > 0 ? engine_->device_memory_bytes()
                                           : -1};
    if (scaler_) {
      rep.loss_scale = scaler_->scale();
      rep.skipped_steps = scaler_->skipped_steps();
    }
    progress_.Report(rep);
    // Under dslaunch the record is the console's to show (once); a line of
    // our own only where nobody receives it.
    if (comm_->rank() == 0 && !progress_.connected()) {
      std::printf(
          "step %6lld  loss %.6f  lr %.3e  grad_norm %.4f  %.0f tok/s%s%s\n",
          static_cast<long long>(step_), last.loss, last.lr, last.grad_norm,
          rep.tokens_per_s, GpuMemoryNote().c_str(), ScaleNote().c_str());
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
