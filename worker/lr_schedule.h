// DeepSpeed's learning-rate schedulers (WarmupLR, WarmupDecayLR,
// WarmupCosineLR) as functions of the step, from a TrainConfig's scheduler
// section.
#ifndef DSLAUNCH_WORKER_LR_SCHEDULE_H_
#define DSLAUNCH_WORKER_LR_SCHEDULE_H_

#include <cstdint>
#include <string_view>

#include "worker/train_config.h"

namespace dslaunch::worker {

// The learning rate DeepSpeed's scheduler computes when its
// last_batch_iteration is `last_batch_iteration` (lr_schedules.py), or
// optimizer.lr without a scheduler. Below 0 it is the value the scheduler
// sets at construction (warmup_min_lr; 0 for WarmupCosineLR). DeepSpeed's
// engine steps the scheduler after each optimizer step, so its optimizer
// step k (0-based) runs at LearningRate(config, k - 1). Past total_num_steps
// WarmupCosineLR rises again, as DeepSpeed's does.
double LearningRate(const TrainConfig& config, int64_t last_batch_iteration);

// DeepSpeed's name of the scheduler ("none" without one).
const char* SchedulerName(SchedulerType type);

// The warm-up length the schedulers really use (at least 2 steps).
int WarmupSteps(const SchedulerConfig& s);

// Whether `param` (a key under scheduler.params) has an effect on `type`.
bool SchedulerUses(SchedulerType type, std::string_view param);

}  // namespace dslaunch::worker

#endif  // DSLAUNCH_WORKER_LR_SCHEDULE_H_
