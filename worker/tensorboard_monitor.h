// TensorBoardMonitor: DeepSpeed's `tensorboard` monitor for dsworker. Rank 0
// writes what DeepSpeed's engine writes, under its names and with the global
// sample count as the step, to <output_path>/<job_name>/; other ranks write
// nothing. Owned by the Trainer; its thread only. Write errors are reported
// once on stderr and never stop training.
#pragma once

#include <cstdint>
#include <memory>

#include "base/status.h"
#include "base/tb_events.h"
#include "worker/train_config.h"

namespace dslaunch::worker {

class TensorBoardMonitor {
 public:
  static constexpr const char* kLossTag = "Train/Samples/train_loss";
  static constexpr const char* kLrTag = "Train/Samples/lr";

  // Disabled, or not rank 0: a monitor that writes nothing. A directory or
  // file that cannot be made is an error naming tensorboard.output_path.
  static StatusOr<std::unique_ptr<TensorBoardMonitor>> Open(
      const TrainConfig& config, int rank);
  ~TensorBoardMonitor();

  // After optimizer step `step` (1-based) of `samples_per_step` samples:
  // DeepSpeed writes the step's loss at the samples seen before it, and the
  // learning rate its scheduler set for the next step at those after it.
  void StepDone(int64_t step, int64_t samples_per_step, float loss,
                double next_lr);
  bool enabled() const { return writer_ != nullptr; }

 private:
  explicit TensorBoardMonitor(std::unique_ptr<base::EventFileWriter> writer)
      : writer_(std::move(writer)) {}

  std::unique_ptr<base::EventFileWriter> writer_;  // null: disabled
  bool error_reported_ = false;
};

}  // namespace dslaunch::worker
