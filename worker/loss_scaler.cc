#include "worker/loss_scaler.h"

#include <algorithm>
#include <cmath>
#include <string>

namespace dslaunch::worker {

LossScaler::LossScaler(const Fp16Config& config)
    : dynamic_(config.loss_scale <= 0),
      scale_(config.loss_scale > 0
                 ? config.loss_scale
                 : std::ldexp(1.0, config.initial_scale_power)),
      min_scale_(config.min_loss_scale),
      window_(std::max(1, config.loss_scale_window)),
      hysteresis_(std::max(1, config.hysteresis)),
      hysteresis_left_(hysteresis_) {}

Status LossScaler::Update(bool overflow) {
  if (overflow) ++skipped_;
  if (!dynamic_) {
    ++iter_;
    return Status::Ok();
  }
  if (overflow) {
    if (hysteresis_left_ <= 1) {
      if (scale_ <= min_scale_) {
        return DataError(
            "fp16: the gradients overflow at the minimum loss scale (" +
            std::to_string(min_scale_) +
            ", fp16.min_loss_scale); the run cannot go on in fp16");
      }
      scale_ = std::max(scale_ / 2, min_scale_);
    } else {
      --hysteresis_left_;
    }
    last_overflow_ = iter_;
  } else if ((iter_ - last_overflow_) % window_ == 0) {
    hysteresis_left_ = hysteresis_;
    scale_ *= 2;
  }
  ++iter_;
  return Status::Ok();
}

}  // namespace dslaunch::worker
