// Trainer: one rank's training loop. It builds the model, the data loader
// and the optimizer state for its ZeRO stage, runs steps (gradient
// accumulation, gradient averaging across ranks, clipping by global norm,
// AdamW with DeepSpeed's schedules), reports progress every steps_per_print
// steps, and evaluates on the validation shard. Owned by dsworker's main;
// single-threaded (the kernels use OpenMP inside).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "worker/comm.h"
#include "worker/data_loader.h"
#include "worker/device_engine.h"
#include "worker/device_loader.h"
#include "worker/model.h"
#include "worker/progress_reporter.h"
#include "worker/tensorboard_monitor.h"
#include "worker/train_config.h"
#include "worker/zero_state.h"

namespace dslaunch::worker {

struct TrainOptions {
  std::string init_model;  // --init: an llm.c model file instead of random init
  bool quiet = false;      // no per-step line on rank 0
  // Where the model trains (resolved: kCpu or kCuda). On kCuda the GPU is
  // LOCAL_RANK's among the visible ones (device_loader.h).
  DeviceKind device = DeviceKind::kCpu;
  int local_rank = 0;
};

struct StepResult {
  float loss = 0;  // mean over ranks and micro-batches
  float grad_norm = 0;
  double lr = 0;
  // A rank got the stop signal (stop_signal.h) by this step's end: every
  // rank stops after it (Run saves a checkpoint of it first).
  int stop_signal = 0;
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
  // One line on what runs: model size, stage, ranks, batch, threads.
  std::string Summary() const;
  StatusOr<StepResult> Step();  // one optimizer step
  StatusOr<float> Evaluate(int batches);
  // Parameters, gradients and optimizer state this rank holds, in bytes.
  int64_t model_state_bytes() const;
  Model& model() { return *model_; }
  int rank() const { return comm_->rank(); }
  // Every parameter in llm.c's order (gathered under stage 3); collective.
  StatusOr<std::vector<float>> WholeParams();
  int64_t step() const { return step_; }

 private:
  Trainer(const TrainConfig& config, std::unique_ptr<Comm> comm);
  Status Init(const TrainOptions& options);
  Status InitSharded(const ModelConfig& mc,
                     const TrainOptions& options);  // stages 2, 3
  // The CUDA engine for stage 0, given the host model's parameters.
  Status InitDevice(const TrainOptions& options);
  Status Device(bool ok) const;  // the engine's error() as a Status
  // The engine's parameters and moments into the host buffers (before a
  // checkpoint or WholeParams); and back after a resume.
  Status PullFromDevice();
  Status PushToDevice();
  StatusOr<StepResult> DeviceStep();
  std::string GpuMemoryNote() const;
  AdamParams Adam(double lr) const;
  Status MaybeResume();
  Status KeepGlobalBatch(const std::string& dir, int64_t saved);
  Status ResumeSharded(const std::string& dir, size_t n);
  Status ResumeMoments(const std::string& dir,
                       size_t n);  // checkpoint.resume: "latest" or a directory
  Status Save();                   // a checkpoint of this step
  Status ReduceGradients();
  StatusOr<float> GlobalGradNorm();
  Status UpdateParameters(double lr, float clip_scale);

  TrainConfig config_;
  std::unique_ptr<Comm> comm_;
  std::unique_ptr<Model> model_;
  std::unique_ptr<ZeroState> zero_;  // stages 2 and 3: the model's ParamSource
  // --device cuda: trains instead of model_, whose host buffers then only
  // carry initial values, checkpoints and the cross-rank gradient sums.
  std::unique_ptr<DeviceEngine> engine_;
  std::unique_ptr<DataLoader> train_;
  std::unique_ptr<DataLoader> val_;
  ProgressReporter progress_;
  std::unique_ptr<TensorBoardMonitor> tensorboard_;  // rank 0's, or inert
  size_t shard_begin_ = 0, shard_size_ = 0;  // this rank's optimizer range
  std::vector<float> m_, v_;                 // moments of that range
  std::vector<float> gather_in_;             // stage 1: own updated piece
  std::vector<float> grad_shard_;            // stage 1: the reduced gradients
  int64_t step_ = 0;
};

}  // namespace dslaunch::worker
