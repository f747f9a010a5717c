// ProgressReporter: what a training rank tells its agent every
// steps_per_print steps, as one JSON line on DSLAUNCH_PROGRESS (when set):
// step, loss (with 9 significant digits, so the float round-trips exactly),
// lr, grad_norm, tokens_per_s, samples_per_s, model_state_bytes, rss_bytes,
// total_steps (the console's progress bar and ETA).
// Reporting is best effort: a missing launcher never stops training.
// Single-threaded.
#pragma once

#include <cstdint>
#include <string>

#include "proto/progress.h"

namespace dslaunch::worker {

struct StepReport {
  int64_t step = 0;
  float loss = 0;
  double lr = 0;
  float grad_norm = 0;
  double tokens_per_s = 0;
  double samples_per_s = 0;
  int64_t model_state_bytes = 0;
  int64_t total_steps = 0;     // 0: not known
  int64_t gpu_mem_bytes = -1;  // the GPU allocator's peak; -1: on the CPU
  // fp16's loss scale and the steps it skipped so far (-1: not fp16).
  double loss_scale = 0;
  int64_t skipped_steps = -1;
};

// The record as one JSON object (no newline).
std::string FormatStepReport(const StepReport& r, int64_t rss_bytes);
// Resident set size of this process, from /proc/self/statm.
int64_t ResidentBytes();

class ProgressReporter {
 public:
  // Connects to $DSLAUNCH_PROGRESS if it is set.
  ProgressReporter();
  void Report(const StepReport& r);
  bool connected() const { return connected_; }

 private:
  proto::ProgressClient client_;
  bool connected_ = false;
};

}  // namespace dslaunch::worker
