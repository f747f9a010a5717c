// LossScaler: fp16 loss scaling as DeepSpeed configures it (`fp16`:
// loss_scale 0 = dynamic, initial_scale_power, loss_scale_window,
// hysteresis, min_loss_scale). The loss is multiplied by scale() before the
// backward pass and the gradients divided by it before the step; a step
// whose gradients overflowed (a non-finite norm) is skipped. Dynamic
// scaling, step by step as DeepSpeed's DynamicLossScaler:
//  - overflow: with hysteresis left (more than 1), it is used up by one;
//    else the scale halves, not below min_loss_scale. An overflow at
//    min_loss_scale is an error (DeepSpeed stops the run there too).
//  - no overflow: each loss_scale_window steps after the last overflow (or
//    the start) the scale doubles and the hysteresis is whole again.
// A static scale (loss_scale > 0) never changes; its overflowed steps are
// skipped too. Single-threaded.
#pragma once

#include <cstdint>

#include "base/status.h"
#include "worker/train_config.h"

namespace dslaunch::worker {

class LossScaler {
 public:
  explicit LossScaler(const Fp16Config& config);

  double scale() const { return scale_; }
  int64_t skipped_steps() const { return skipped_; }
  // After a step's gradients: whether they overflowed (the step is then
  // skipped). FailedPrecondition-like DataError at the minimum scale.
  Status Update(bool overflow);

 private:
  bool dynamic_;
  double scale_;
  double min_scale_;
  int window_;
  int hysteresis_;
  int hysteresis_left_;
  int64_t iter_ = 0;
  int64_t last_overflow_ = -1;
  int64_t skipped_ = 0;
};

}  // namespace dslaunch::worker
