#include "worker/tensorboard_monitor.h"

#include <chrono>  // system_clock
#include <cstdio>  // fprintf
#include <utility>

#include "base/unix_time.h"

namespace dslaunch::worker {
StatusOr<std::unique_ptr<TensorBoardMonitor>> TensorBoardMonitor::Open(
    const TrainConfig& config, int rank) {
  std::unique_ptr<base::EventFileWriter> writer;
  if (config.tensorboard.enabled && rank == 0) {
    const auto set_at = config.sources.find("tensorboard.output_path");
    const std::string where =
        (set_at != config.sources.end() ? set_at->second : config.path) +
        ": tensorboard.output_path";
    ASSIGN_OR_RETURN(writer, base::EventFileWriter::Create(
                                 TensorBoardDir(config.tensorboard),
                                 base::UnixSeconds(), where));
  }
  return std::unique_ptr<TensorBoardMonitor>(
      new TensorBoardMonitor(std::move(writer)));
}

TensorBoardMonitor::~TensorBoardMonitor() {
  if (writer_) writer_->Close();
}

void TensorBoardMonitor::StepDone(int64_t step, int64_t samples_per_step,
                                  float loss, double next_lr) {
  if (!writer_) return;
  const double now = base::UnixSeconds();
  writer_->AddScalar(kLossTag, (step - 1) * samples_per_step, loss, now);
  writer_->AddScalar(kLrTag, step * samples_per_step, next_lr, now);
  writer_->Flush();  // as DeepSpeed does after every write
  if (!writer_->status().ok() && !error_reported_) {
    std::fprintf(stderr, "dsworker: tensorboard: %s (no more events)\n",
                 writer_->status().message().c_str());
    error_reported_ = true;
  }
}

}  // namespace dslaunch::worker
