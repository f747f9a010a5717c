// TrainConfig: dsworker's training settings, read from
// a DeepSpeed JSON config (or the same keys in YAML) plus dsworker's own
// model/data/train/checkpoint sections, then adjusted by `key.path=value`
// overrides from the command line. A plain value built once by the worker's
// main thread and then only read; the functions here are pure, any thread.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"  // Status, StatusOr

namespace dslaunch::worker {

// DeepSpeed's rule: train_batch_size = micro * accumulation * world_size.
// Any two given determine the third; only train_batch_size, or only the
// micro batch, implies accumulation 1; all three must multiply out.
struct BatchConfig {
  // As written in the config or an override; nullopt when not given.
  std::optional<int> given_train_batch_size;
  std::optional<int> given_micro_batch_per_gpu;
  std::optional<int> given_gradient_accumulation_steps;
  // Resolved for `world_size`; all > 0 in a parsed config.
  int world_size = 1;
  int train_batch_size = 0;
  int micro_batch_per_gpu = 0;
  int gradient_accumulation_steps = 0;
};

enum class OptimizerType { kAdam, kAdamW };

// `optimizer`: DeepSpeed's Adam/AdamW (type is case-insensitive, as there).
struct OptimizerConfig {
  OptimizerType type = OptimizerType::kAdamW;
  bool adam_w_mode = true;  // params.adam_w_mode; only read for Adam
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0.0;
  // Decoupled (AdamW-style) weight decay: AdamW, or Adam with adam_w_mode,
  // exactly as DeepSpeed picks FusedAdam's mode.
  bool decoupled_weight_decay() const {
    return type == OptimizerType::kAdamW || adam_w_mode;
  }
};

enum class SchedulerType { kNone, kWarmupLR, kWarmupDecayLR, kWarmupCosineLR };
enum class WarmupType { kLog, kLinear };

// `scheduler`: DeepSpeed's lr_schedules.py with its defaults. kNone keeps
// optimizer.lr constant.
struct SchedulerConfig {
  SchedulerType type = SchedulerType::kNone;
  double warmup_min_lr = 0.0;  // WarmupLR, WarmupDecayLR
  // WarmupLR, WarmupDecayLR; when not given, optimizer.lr (DeepSpeed's newer
  // default; equal to its older fixed 0.001 when optimizer.lr is not given).
  std::optional<double> warmup_max_lr;
  int warmup_num_steps = 1000;  // all; DeepSpeed uses max(2, this)
  WarmupType warmup_type = WarmupType::kLog;  // all
  int total_num_steps = 0;        // WarmupDecayLR, WarmupCosineLR: required
  double warmup_min_ratio = 0.0;  // WarmupCosineLR, of optimizer.lr
  double cos_min_ratio = 0.0001;  // WarmupCosineLR, of optimizer.lr
};

// `fp16` with DeepSpeed's defaults (loss_scale 0 = dynamic scaling).
struct Fp16Config {
  bool enabled = false;
  double loss_scale = 0.0;
  int initial_scale_power = 16;
  int loss_scale_window = 1000;
  int hysteresis = 2;
  double min_loss_scale = 1.0;
};

enum class OffloadDevice { kNone, kCpu };

// `zero_optimization` with DeepSpeed's defaults.
struct ZeroConfig {
  int stage = 0;  // 0..3
  int64_t reduce_bucket_size = 500000000;
  int64_t allgather_bucket_size = 500000000;
  bool overlap_comm = false;
  bool contiguous_gradients = true;
  OffloadDevice offload_optimizer = OffloadDevice::kNone;
  OffloadDevice offload_param = OffloadDevice::kNone;  // stage 3 only
};

// `model`: a GPT-2 shape. A preset ("d4", "d6", "d12", "d24", "d36", "d48",
// llm.c's depths) fills n_layer/n_head/n_embd; explicit keys win over it.
struct ModelSection {
  std::string preset = "d12";
  int n_layer = 12;
  int n_head = 12;
  int n_embd = 768;
  int seq_len = 1024;
  int vocab_size = 50257;
};

// `data`: llm.c token shards; `train` may be a glob.
struct DataConfig {
  std::string train;
  std::string val;
  bool shuffle = true;
};

// `train`: the loop itself. steps 0 = not given; eval_every 0 = never.
struct TrainLoopConfig {
  int64_t steps = 0;
  uint64_t seed = 1337;
  int64_t eval_every = 0;
};

// `checkpoint`: every 0 = never; keep 0 = keep all. resume: "" = start
// fresh, "latest" (also written `true`) = newest in dir, else a path.
struct CheckpointConfig {
  std::string dir;
  int64_t every = 0;
  int keep = 0;
  std::string resume;
};

// `tensorboard`: DeepSpeed's TensorBoard monitor. When enabled, rank 0
// writes its Train/Samples/* scalars to TensorBoardDir() (DeepSpeed's
// os.path.join(output_path, job_name); "" is the working directory).
struct TensorBoardConfig {
  bool enabled = false;
  std::string output_path;
  std::string job_name = "DeepSpeedJobName";
};

// output_path joined with job_name as Python's os.path.join does.
std::string TensorBoardDir(const TensorBoardConfig& tb);

struct TrainConfig {
  std::string path;  // the file read (messages only)
  BatchConfig batch;
  OptimizerConfig optimizer;
  SchedulerConfig scheduler;
  double gradient_clipping = 0.0;  // max global grad norm; 0 = off
  int steps_per_print = 10;
  Fp16Config fp16;
  bool bf16 = false;  // bf16.enabled
  ZeroConfig zero;
  ModelSection model;
  DataConfig data;
  TrainLoopConfig train;
  CheckpointConfig checkpoint;
  TensorBoardConfig tensorboard;
  // "file:line: unknown key 'a.b'" and similar; the caller logs them.
  std::vector<std::string> warnings;
  // Where each dotted key was set: "file:line" or "override 'k=v'".
  std::map<std::string, std::string> sources;
};

// Parses config text (JSON or YAML) for `world_size` ranks; `path` is only
// used in messages. Unknown keys become warnings; a wrong type, a value out
// of range or a contradiction is a DataError starting "path:line: " and
// naming the dotted key (or "path: " when no single line is at fault).
StatusOr<TrainConfig> ParseTrainConfig(std::string_view text,
                                       const std::string& path, int world_size);

// Reads and parses the file; an unreadable file is a DataError naming it.
StatusOr<TrainConfig> LoadTrainConfig(const std::string& path,
                                      int world_size = 1);

// Applies one command-line override such as "train.steps=100",
// "optimizer.params.betas=[0.9,0.95]" or "data.train=/d/*.bin" (a value
// that is not valid YAML is taken as a string), then re-checks the whole
// config (batch sizes are re-resolved). A malformed override, an unknown
// key or a bad value is an InvalidArgument naming the override; a
// contradiction with the file is a DataError. On error *config is unchanged.
Status ApplyOverride(TrainConfig* config, std::string_view assignment);

}  // namespace dslaunch::worker
