// Trainer: one rank's training loop over an Engine (worker/engine.h: the
// model, gradients and optimizer state of its ZeRO stage on its device). It
// runs steps (gradient accumulation, gradient averaging across ranks,
// clipping by global norm, AdamW with DeepSpeed's schedules), saves and
// resumes checkpoints, reports progress every steps_per_print steps, and
// evaluates on the validation shard. Owned by dsworker's main;
// single-threaded (the kernels use OpenMP inside).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "worker/comm.h"
#include "worker/cpu_adam.h"
#include "worker/data_loader.h"
#include "worker/device_loader.h"
#include "worker/engine.h"
#include "worker/loss_scaler.h"
#include "worker/progress_reporter.h"
#include "worker/tensorboard_monitor.h"
#include "worker/train_config.h"

namespace dslaunch::worker {

struct TrainOptions {
  std::string init_model;  // --init: an llm.c model file instead of random init
  bool quiet = false;      // no per-step line on rank 0
  // Where the model trains (resolved: kCpu or kCuda). On kCuda the GPU is
  // LOCAL_RANK's among the visible ones (device_loader.h).
  DeviceKind device = DeviceKind::kCpu;
  int local_rank = 0;
  // Makes the engine instead of MakeEngine (tests: an engine of their own).
  std::function<StatusOr<std::unique_ptr<Engine>>(const TrainConfig&, Comm*,
                                                  const EngineOptions&)>
      make_engine = nullptr;
};

struct StepResult {
  float loss = 0;  // mean over ranks and micro-batches
  float grad_norm = 0;
  double lr = 0;
  // A rank got the stop signal (stop_signal.h) by this step's end: every
  // rank stops after it (Run saves a checkpoint of it first).
  int stop_signal = 0;
  // fp16: the loss scale the step ran with; whether its gradients
  // overflowed, so that no update was made (grad_norm is then not finite).
  double loss_scale = 0;
  bool skipped = false;
};

class Trainer {
 public:
  static StatusOr<std::unique_ptr<Trainer>> Create(const TrainConfig& config,
                                                   std::unique_ptr<Comm> comm,
                                                   const TrainOptions& options);
  // Runs train.steps steps, or fewer when a stop signal came (then the
  // result's stop_signal is set, after a checkpoint of the last step where
  // checkpoint.dir is set); returns the last step's result.
  StatusOr<StepResult> Run();
  // One line on what runs: model size, stage, ranks, batch, threads, device.
  std::string Summary() const;
  StatusOr<StepResult> Step();  // one optimizer step
  StatusOr<float> Evaluate(int batches);
  // Parameters, gradients and optimizer state this rank holds, in bytes.
  int64_t model_state_bytes() const;
  // The GPU allocator's peak in bytes; 0 on the CPU.
  int64_t device_memory_bytes() const;
  const ModelConfig& model_config() const { return engine_->model_config(); }
  int rank() const { return comm_->rank(); }
  // Every parameter in llm.c's order (gathered under stage 3); collective.
  StatusOr<std::vector<float>> WholeParams();
  int64_t step() const { return step_; }

 private:
  Trainer(const TrainConfig& config, std::unique_ptr<Comm> comm);
  Status Init(const TrainOptions& options);
  AdamParams Adam(double lr) const;
  Status MaybeResume();  // checkpoint.resume: "latest" or a directory
  Status KeepGlobalBatch(const std::string& dir, int64_t saved);
  Status Save();  // a checkpoint of this step
  std::string GpuMemoryNote() const;
  std::string ScaleNote() const;

  TrainConfig config_;
  std::unique_ptr<Comm> comm_;
  std::unique_ptr<Engine> engine_;
  std::unique_ptr<DataLoader> train_;
  std::unique_ptr<DataLoader> val_;
  ProgressReporter progress_;
  std::unique_ptr<TensorBoardMonitor> tensorboard_;  // rank 0's, or inert
  std::optional<LossScaler> scaler_;                 // fp16
  int64_t step_ = 0;
  // Steps whose update was made (fp16 skips those that overflowed): what
  // AdamW's bias correction and the LR schedule count, as in DeepSpeed.
  int64_t applied_ = 0;
};

}  // namespace dslaunch::worker
