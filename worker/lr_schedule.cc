#include "worker/lr_schedule.h"

#include <algorithm>  // max
#include <cmath>      // cos, log
#include <numbers>    // pi

namespace dslaunch::worker {

const char* SchedulerName(SchedulerType type) {
  switch (type) {
    case SchedulerType::kWarmupLR:
      return "WarmupLR";
    case SchedulerType::kWarmupDecayLR:
      return "WarmupDecayLR";
    case SchedulerType::kWarmupCosineLR:
      return "WarmupCosineLR";
    case SchedulerType::kNone:
      break;
  }
  return "none";
}

int WarmupSteps(const SchedulerConfig& s) {
  return std::max(2, s.warmup_num_steps);
}

bool SchedulerUses(SchedulerType type, std::string_view param) {
  if (param == "warmup_num_steps" || param == "warmup_type") return true;
  if (param == "warmup_min_lr" || param == "warmup_max_lr") {
    return type == SchedulerType::kWarmupLR ||
           type == SchedulerType::kWarmupDecayLR;
  }
  if (param == "total_num_steps") return type != SchedulerType::kWarmupLR;
  return type == SchedulerType::kWarmupCosineLR;
}

double LearningRate(const TrainConfig& config, int64_t last_batch_iteration) {
  const SchedulerConfig& s = config.scheduler;
  const double lr = config.optimizer.lr;
  const double min_lr = s.warmup_min_lr;
  const double max_lr = s.warmup_max_lr.value_or(lr);
  if (s.type == SchedulerType::kNone) return lr;
  if (last_batch_iteration < 0) {
    return s.type == SchedulerType::kWarmupCosineLR ? 0.0 : min_lr;
  }
  const double step = static_cast<double>(last_batch_iteration);
  const int warmup = WarmupSteps(s);
  if (last_batch_iteration < warmup) {
    const double gamma = s.warmup_type == WarmupType::kLog
                             ? (1.0 / std::log(warmup)) * std::log(step + 1)
                             : step / warmup;
    if (s.type != SchedulerType::kWarmupCosineLR) {
      return min_lr + (max_lr - min_lr) * gamma;
    }
    return lr * (s.warmup_min_ratio + gamma * (1.0 - s.warmup_min_ratio));
  }
  const double total = s.total_num_steps;
  switch (s.type) {
    case SchedulerType::kWarmupLR:
      return max_lr;
    case SchedulerType::kWarmupDecayLR: {
      const double gamma =
          std::max(0.0, (total - step) / std::max(1.0, total - warmup));
      return min_lr + (max_lr - min_lr) * gamma;
    }
    case SchedulerType::kWarmupCosineLR: {
      const double real_step = step - warmup + 1;
      const double cosine =
          (1 + std::cos(std::numbers::pi * real_step / (total - warmup))) / 2;
      const double ratio =
          std::max(0.0, s.cos_min_ratio + (1.0 - s.cos_min_ratio) * cosine);
      return lr * ratio;
    }
    case SchedulerType::kNone:
      break;
  }
  return lr;
}

}  // namespace dslaunch::worker
