#include "worker/train_config.h"

#include <gtest/gtest.h>

#include <cmath>       // cos, log
#include <filesystem>  // temp_directory_path, remove
#include <fstream>     // ofstream
#include <numbers>     // pi
#include <string>

#include "worker/lr_schedule.h"

namespace dslaunch::worker {
namespace {

StatusOr<TrainConfig> Parse(const std::string& text, int world_size = 1) {
  return ParseTrainConfig(text, "ds.json", world_size);
}

// Parses `text`, which must fail with a DataError, and returns the message.
std::string ParseError(const std::string& text, int world_size = 1) {
  StatusOr<TrainConfig> result = Parse(text, world_size);
  EXPECT_FALSE(result.ok()) << "parsed unexpectedly: " << text;
  if (result.ok()) return "";
  EXPECT_EQ(result.status().code(), StatusCode::kDataError);
  return result.status().message();
}

TrainConfig ParseOk(const std::string& text, int world_size = 1) {
  StatusOr<TrainConfig> result = Parse(text, world_size);
  EXPECT_TRUE(result.ok()) << result.status().message();
  return result.ok() ? *result : TrainConfig{};
}

constexpr char kFullJson[] = R"({
  "train_batch_size": 32,
  "train_micro_batch_size_per_gpu": 4,
  "gradient_clipping": 1.0,
  "steps_per_print": 5,
  "optimizer": {"type": "AdamW",
                "params": {"lr": 6e-4, "betas": [0.9, 0.95], "eps": 1e-8,
                           "weight_decay": 0.1}},
  "scheduler": {"type": "WarmupCosineLR",
                "params": {"total_num_steps": 1000, "warmup_num_steps": 50,
                           "warmup_type": "linear", "cos_min_ratio": 0.1}},
  "bf16": {"enabled": true},
  "zero_optimization": {"stage": 2, "reduce_bucket_size": 5e7,
                        "overlap_comm": true,
                        "offload_optimizer": {"device": "cpu"}},
  "model": {"preset": "d6", "seq_len": 256},
  "data": {"train": "data/train_*.bin", "val": "data/val.bin",
           "shuffle": false},
  "train": {"steps": 1000, "seed": 7, "eval_every": 100},
  "checkpoint": {"dir": "ckpt", "every": 200, "keep": 3, "resume": true}
})";

TEST(TrainConfig, ParsesDeepSpeedJsonAndOwnSections) {
  TrainConfig c = ParseOk(kFullJson, 2);
  EXPECT_EQ(c.batch.train_batch_size, 32);
  EXPECT_EQ(c.batch.micro_batch_per_gpu, 4);
  EXPECT_EQ(c.batch.gradient_accumulation_steps, 4);
  EXPECT_EQ(c.gradient_clipping, 1.0);
  EXPECT_EQ(c.steps_per_print, 5);
  EXPECT_EQ(c.optimizer.type, OptimizerType::kAdamW);
  EXPECT_TRUE(c.optimizer.decoupled_weight_decay());
  EXPECT_EQ(c.optimizer.lr, 6e-4);
  EXPECT_EQ(c.optimizer.beta2, 0.95);
  EXPECT_EQ(c.optimizer.weight_decay, 0.1);
  EXPECT_EQ(c.scheduler.type, SchedulerType::kWarmupCosineLR);
  EXPECT_EQ(c.scheduler.warmup_type, WarmupType::kLinear);
  EXPECT_EQ(c.scheduler.total_num_steps, 1000);
  EXPECT_TRUE(c.bf16);
  EXPECT_FALSE(c.fp16.enabled);
  EXPECT_EQ(c.zero.stage, 2);
  EXPECT_EQ(c.zero.reduce_bucket_size, 50000000);
  EXPECT_EQ(c.zero.allgather_bucket_size, 500000000);
  EXPECT_TRUE(c.zero.overlap_comm);
  EXPECT_EQ(c.zero.offload_optimizer, OffloadDevice::kCpu);
  EXPECT_EQ(c.model.n_layer, 6);
  EXPECT_EQ(c.model.n_embd, 384);
  EXPECT_EQ(c.model.seq_len, 256);
  EXPECT_EQ(c.data.train, "data/train_*.bin");
  EXPECT_FALSE(c.data.shuffle);
  EXPECT_EQ(c.train.steps, 1000);
  EXPECT_EQ(c.train.seed, 7u);
  EXPECT_EQ(c.checkpoint.keep, 3);
  EXPECT_EQ(c.checkpoint.resume, "latest");
  EXPECT_TRUE(c.warnings.empty()) << c.warnings[0];
  EXPECT_EQ(c.sources.at("zero_optimization.stage"), "ds.json:13");
}

TEST(TrainConfig, ReadsTheSameKeysFromYamlWithDefaults) {
  TrainConfig c = ParseOk(
      "train_micro_batch_size_per_gpu: 8\n"
      "optimizer:\n  type: Adam\n  params:\n    lr: 1.0e-3\n"
      "    adam_w_mode: false\n");
  EXPECT_EQ(c.batch.train_batch_size, 8);
  EXPECT_EQ(c.batch.gradient_accumulation_steps, 1);
  EXPECT_EQ(c.optimizer.type, OptimizerType::kAdam);
  EXPECT_FALSE(c.optimizer.decoupled_weight_decay());
  EXPECT_EQ(c.steps_per_print, 10);
  EXPECT_EQ(c.zero.stage, 0);
  EXPECT_TRUE(c.zero.contiguous_gradients);
  EXPECT_EQ(c.model.n_layer, 12);
  EXPECT_TRUE(c.data.shuffle);
  EXPECT_EQ(c.scheduler.type, SchedulerType::kNone);
}

TEST(TrainConfig, OptimizerTypeIgnoresCaseAndAdamDefaultsToAdamWMode) {
  TrainConfig c =
      ParseOk(R"({"train_batch_size": 1, "optimizer": {"type": "adam"}})");
  EXPECT_EQ(c.optimizer.type, OptimizerType::kAdam);
  EXPECT_TRUE(c.optimizer.decoupled_weight_decay());
  EXPECT_EQ(ParseError(R"({"train_batch_size": 1,
  "optimizer": {"type": "Lamb"}})"),
            "ds.json:2: optimizer.type: 'Lamb' is not one of Adam, AdamW");
}

TEST(TrainConfig, DerivesAccumulationFromBatchAndMicro) {
  TrainConfig c = ParseOk(
      R"({"train_batch_size": 48, "train_micro_batch_size_per_gpu": 4})", 3);
  EXPECT_EQ(c.batch.gradient_accumulation_steps, 4);
}

TEST(TrainConfig, DerivesMicroFromBatchAndAccumulation) {
  TrainConfig c = ParseOk(
      R"({"train_batch_size": 48, "gradient_accumulation_steps": 2})", 3);
  EXPECT_EQ(c.batch.micro_batch_per_gpu, 8);
}

TEST(TrainConfig, DerivesBatchFromMicroAndAccumulation) {
  TrainConfig c = ParseOk(
      "train_micro_batch_size_per_gpu: 4\ngradient_accumulation_steps: 2\n", 3);
  EXPECT_EQ(c.batch.train_batch_size, 24);
}

TEST(TrainConfig, OnlyTrainBatchSizeSplitsItAcrossRanks) {
  TrainConfig c = ParseOk("train_batch_size: 12\n", 3);
  EXPECT_EQ(c.batch.micro_batch_per_gpu, 4);
  EXPECT_EQ(c.batch.gradient_accumulation_steps, 1);
  EXPECT_EQ(ParseError("\ntrain_batch_size: 10\n", 3),
            "ds.json:2: train_batch_size 10 is not divisible by world_size 3");
}

TEST(TrainConfig, RejectsBatchSizesThatDoNotMultiplyOut) {
  EXPECT_EQ(ParseError("train_batch_size: 32\n"
                       "train_micro_batch_size_per_gpu: 4\n"
                       "gradient_accumulation_steps: 3\n",
                       2),
            "ds.json:1: train_batch_size 32 != train_micro_batch_size_per_gpu "
            "4 * gradient_accumulation_steps 3 * world_size 2 (= 24)");
}

TEST(TrainConfig, RejectsTrainBatchNotDivisibleByMicroOrAccumulation) {
  EXPECT_EQ(ParseError("train_batch_size: 30\n"
                       "train_micro_batch_size_per_gpu: 4\n",
                       2),
            "ds.json:1: train_batch_size 30 is not divisible by "
            "train_micro_batch_size_per_gpu 4 * world_size 2");
  EXPECT_EQ(ParseError("train_batch_size: 30\n"
                       "gradient_accumulation_steps: 4\n"),
            "ds.json:1: train_batch_size 30 is not divisible by "
            "gradient_accumulation_steps 4 * world_size 1");
}

TEST(TrainConfig, RequiresABatchSize) {
  const std::string want =
      "ds.json: train_batch_size or train_micro_batch_size_per_gpu is "
      "required";
  EXPECT_EQ(ParseError("steps_per_print: 1\n"), want);
  EXPECT_EQ(ParseError("gradient_accumulation_steps: 4\n"), want);
  EXPECT_EQ(ParseError("train_batch_size: 0\n"),
            "ds.json:1: train_batch_size: 0 is out of range (must be in [1, "
            "1073741824])");
}

TEST(TrainConfig, RejectsZeroStageOutsideZeroToThree) {
  EXPECT_EQ(ParseError("train_batch_size: 1\n"
                       "zero_optimization:\n  stage: 5\n"),
            "ds.json:3: zero_optimization.stage: 5 is out of range (must be "
            "in [0, 3])");
}

TEST(TrainConfig, RejectsFp16AndBf16Together) {
  EXPECT_EQ(ParseError(R"({"train_batch_size": 1,
  "fp16": {"enabled": true},
  "bf16": {"enabled": true}})"),
            "ds.json:3: fp16.enabled and bf16.enabled are both true; enable "
            "at most one");
  TrainConfig c =
      ParseOk("train_batch_size: 1\nfp16: {enabled: true, loss_scale: 0}\n");
  EXPECT_TRUE(c.fp16.enabled);
  EXPECT_EQ(c.fp16.initial_scale_power, 16);
}

TEST(TrainConfig, WarnsAboutUnknownKeysWithTheirLine) {
  TrainConfig c = ParseOk(R"({
  "train_batch_size": 8,
  "wall_clock_breakdown": false,
  "zero_optimization": {
    "stage": 1,
    "round_robin_gradients": true
  }
})");
  ASSERT_EQ(c.warnings.size(), 2u);
  EXPECT_EQ(c.warnings[0], "ds.json:3: unknown key 'wall_clock_breakdown'");
  EXPECT_EQ(c.warnings[1],
            "ds.json:6: unknown key 'zero_optimization.round_robin_gradients'");
  TrainConfig y = ParseOk("train_batch_size: 8\nmodel:\n  depth: 3\n");
  ASSERT_EQ(y.warnings.size(), 1u);
  EXPECT_EQ(y.warnings[0], "ds.json:3: unknown key 'model.depth'");
}

TEST(TrainConfig, TypeErrorsNameTheKeyAndLine) {
  EXPECT_EQ(ParseError("train_batch_size: 8\ntrain:\n  steps: lots\n"),
            "ds.json:3: train.steps: expected an integer, got 'lots'");
  EXPECT_EQ(ParseError("train_batch_size: 8\nbf16: {enabled: maybe}\n"),
            "ds.json:2: bf16.enabled: expected true or false, got 'maybe'");
  EXPECT_EQ(ParseError("train_batch_size: 8\noptimizer: Adam\n"),
            "ds.json:2: optimizer: expected a mapping, got 'Adam'");
  EXPECT_EQ(ParseError("train_batch_size: 8\ngradient_clipping: [1]\n"),
            "ds.json:2: gradient_clipping: expected a number, got a list");
  EXPECT_EQ(ParseError("train_batch_size: 8\n"
                       "optimizer: {params: {betas: [0.9]}}\n"),
            "ds.json:2: optimizer.params.betas: expected a list of two "
            "numbers, got a list");
}

TEST(TrainConfig, RejectsDuplicateKeysAndBadSyntax) {
  EXPECT_EQ(ParseError("train_batch_size: 8\ntrain_batch_size: 4\n"),
            "ds.json:2: duplicate key 'train_batch_size'");
  EXPECT_EQ(
      ParseError("{\"train_batch_size\": 8,\n\"x\": [1, 2}\n").substr(0, 10),
      "ds.json:2:");
  EXPECT_EQ(ParseError("[1, 2]"),
            "ds.json: expected a mapping of settings, got a list");
}

TEST(TrainConfig, RejectsUnsupportedSchedulersAndOffloadDevices) {
  EXPECT_EQ(ParseError("train_batch_size: 8\nscheduler: {type: OneCycle}\n"),
            "ds.json:2: scheduler.type: 'OneCycle' is not one of WarmupLR, "
            "WarmupDecayLR, WarmupCosineLR");
  EXPECT_EQ(ParseError("train_batch_size: 8\nzero_optimization:\n"
                       "  offload_param: {device: nvme}\n"),
            "ds.json:3: zero_optimization.offload_param.device: 'nvme' is "
            "not one of none, cpu");
  EXPECT_EQ(ParseError("train_batch_size: 8\nscheduler: {params: {}}\n"),
            "ds.json:2: scheduler.type is required in a scheduler section");
}

TEST(TrainConfig, DecayingSchedulersNeedTotalNumSteps) {
  EXPECT_EQ(ParseError("train_batch_size: 8\n"
                       "scheduler: {type: WarmupDecayLR}\n"),
            "ds.json:2: scheduler.params.total_num_steps is required by "
            "WarmupDecayLR");
  EXPECT_EQ(ParseError("train_batch_size: 8\nscheduler:\n"
                       "  type: WarmupCosineLR\n  params:\n"
                       "    total_num_steps: 10\n    warmup_num_steps: 10\n"),
            "ds.json:5: scheduler.params.total_num_steps 10 must exceed "
            "warmup_num_steps 10 for WarmupCosineLR");
}

TEST(TrainConfig, WarnsAboutSchedulerParamsTheTypeIgnores) {
  TrainConfig c = ParseOk(
      "train_batch_size: 8\nscheduler:\n  type: WarmupLR\n  params:\n"
      "    cos_min_ratio: 0.1\n");
  ASSERT_EQ(c.warnings.size(), 1u);
  EXPECT_EQ(
      c.warnings[0],
      "ds.json:5: scheduler.params.cos_min_ratio is not used by WarmupLR");
}

TEST(TrainConfig, ModelPresetFillsShapeAndExplicitKeysWin) {
  TrainConfig c =
      ParseOk("train_batch_size: 8\nmodel: {n_layer: 2, preset: d24}\n");
  EXPECT_EQ(c.model.n_layer, 2);
  EXPECT_EQ(c.model.n_head, 16);
  EXPECT_EQ(c.model.n_embd, 1024);
  EXPECT_EQ(ParseError("train_batch_size: 8\nmodel: {preset: d7}\n"),
            "ds.json:2: model.preset: unknown preset 'd7' (d4, d6, d12, d24, "
            "d36, d48)");
  EXPECT_EQ(ParseError("train_batch_size: 8\nmodel: {n_embd: 100}\n"),
            "ds.json:2: model.n_embd 100 is not divisible by model.n_head 12");
}

TEST(TrainConfig, LoadsAFileAndNamesAMissingOne) {
  const std::string path =
      (std::filesystem::temp_directory_path() / "dsl_train_config_test.yaml")
          .string();
  std::ofstream(path) << "train_batch_size: 4\ntrain: {steps: 3}\n";
  StatusOr<TrainConfig> c = LoadTrainConfig(path, 2);
  ASSERT_TRUE(c.ok()) << c.status().message();
  EXPECT_EQ(c->batch.micro_batch_per_gpu, 2);
  EXPECT_EQ(c->train.steps, 3);
  EXPECT_EQ(c->path, path);
  std::filesystem::remove(path);
  StatusOr<TrainConfig> missing = LoadTrainConfig(path);
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().code(), StatusCode::kDataError);
  EXPECT_EQ(missing.status().message(),
            path + ": cannot read: No such file or directory");
}

TEST(TrainConfig, AppliesOverridesOfEveryKind) {
  TrainConfig c = ParseOk(kFullJson, 2);
  ASSERT_TRUE(ApplyOverride(&c, "train.steps=100").ok());
  ASSERT_TRUE(ApplyOverride(&c, "optimizer.params.betas=[0.8, 0.9]").ok());
  ASSERT_TRUE(ApplyOverride(&c, "data.train=*.bin").ok());
  ASSERT_TRUE(ApplyOverride(&c, "zero_optimization={stage: 3}").ok());
  ASSERT_TRUE(ApplyOverride(&c, "checkpoint.resume=").ok());
  EXPECT_EQ(c.train.steps, 100);
  EXPECT_EQ(c.optimizer.beta1, 0.8);
  EXPECT_EQ(c.data.train, "*.bin");
  EXPECT_EQ(c.zero.stage, 3);
  EXPECT_EQ(c.checkpoint.resume, "");
  EXPECT_EQ(c.sources.at("train.steps"), "override 'train.steps=100'");
}

TEST(TrainConfig, OverrideReResolvesBatchSizes) {
  TrainConfig c = ParseOk("train_micro_batch_size_per_gpu: 4\n", 2);
  ASSERT_TRUE(ApplyOverride(&c, "gradient_accumulation_steps=3").ok());
  EXPECT_EQ(c.batch.train_batch_size, 24);
  Status status = ApplyOverride(&c, "train_batch_size=20");
  EXPECT_EQ(status.code(), StatusCode::kDataError);
  EXPECT_EQ(status.message(),
            "override 'train_batch_size=20': train_batch_size 20 != "
            "train_micro_batch_size_per_gpu 4 * gradient_accumulation_steps "
            "3 * world_size 2 (= 24)");
  EXPECT_EQ(c.batch.train_batch_size, 24);  // unchanged on error
}

TEST(TrainConfig, RejectsBadOverridesLeavingConfigUnchanged) {
  TrainConfig c = ParseOk(kFullJson, 2);
  Status status = ApplyOverride(&c, "train.step=5");
  EXPECT_EQ(status.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(status.message(),
            "override 'train.step=5': unknown key 'train.step'");
  status = ApplyOverride(&c, "train.steps");
  EXPECT_EQ(status.message(),
            "override 'train.steps': expected key.path=value");
  status = ApplyOverride(&c, "zero_optimization.stage=4");
  EXPECT_EQ(status.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(status.message(),
            "override 'zero_optimization.stage=4': zero_optimization.stage: 4 "
            "is out of range (must be in [0, 3])");
  status = ApplyOverride(&c, "fp16.enabled=true");
  EXPECT_EQ(status.code(), StatusCode::kDataError);
  EXPECT_EQ(status.message(),
            "ds.json:12: fp16.enabled and bf16.enabled are both true; enable "
            "at most one");
  EXPECT_EQ(c.zero.stage, 2);
  EXPECT_FALSE(c.fp16.enabled);
}

// DeepSpeed's lr_schedules.py, transcribed for the tests.
double DsWarmupGamma(int step, int warmup, bool log) {
  const int w = std::max(2, warmup);
  return log ? (1.0 / std::log(w)) * std::log(step + 1)
             : static_cast<double>(step) / w;
}

TrainConfig WithScheduler(const std::string& scheduler) {
  return ParseOk("train_batch_size: 1\noptimizer: {params: {lr: 0.1}}\n" +
                 scheduler);
}

TEST(TrainConfig, WarmupLRFollowsDeepSpeedLogAndLinear) {
  TrainConfig log = WithScheduler(
      "scheduler: {type: WarmupLR, params: {warmup_min_lr: 0.001, "
      "warmup_max_lr: 0.011, warmup_num_steps: 10}}\n");
  for (int step : {0, 1, 4, 9}) {
    EXPECT_DOUBLE_EQ(LearningRate(log, step),
                     0.001 + 0.01 * DsWarmupGamma(step, 10, true))
        << step;
  }
  EXPECT_NEAR(LearningRate(log, 4), 0.001 + 0.01 * 0.69897000433601886, 1e-15);
  EXPECT_EQ(LearningRate(log, 10), 0.011);
  EXPECT_EQ(LearningRate(log, 5000), 0.011);
  EXPECT_EQ(LearningRate(log, -1), 0.001);
  TrainConfig linear = WithScheduler(
      "scheduler: {type: WarmupLR, params: {warmup_num_steps: 10, "
      "warmup_type: linear}}\n");
  EXPECT_DOUBLE_EQ(LearningRate(linear, 4), 0.1 * 0.4);  // max = optimizer lr
  EXPECT_EQ(LearningRate(linear, 10), 0.1);
}

TEST(TrainConfig, WarmupDecayLRDecaysLinearlyToMinLr) {
  TrainConfig c = WithScheduler(
      "scheduler: {type: WarmupDecayLR, params: {warmup_min_lr: 0.0, "
      "warmup_max_lr: 0.02, warmup_num_steps: 10, total_num_steps: 30, "
      "warmup_type: linear}}\n");
  EXPECT_DOUBLE_EQ(LearningRate(c, 5), 0.01);
  EXPECT_DOUBLE_EQ(LearningRate(c, 10), 0.02);
  EXPECT_DOUBLE_EQ(LearningRate(c, 20), 0.01);  // (30 - 20) / (30 - 10)
  EXPECT_DOUBLE_EQ(LearningRate(c, 25), 0.02 * 5.0 / 20.0);
  EXPECT_EQ(LearningRate(c, 30), 0.0);
  EXPECT_EQ(LearningRate(c, 40), 0.0);
}

TEST(TrainConfig, WarmupCosineLRScalesOptimizerLr) {
  TrainConfig c = WithScheduler(
      "scheduler: {type: WarmupCosineLR, params: {total_num_steps: 110, "
      "warmup_num_steps: 10, warmup_min_ratio: 0.2, cos_min_ratio: 0.1, "
      "warmup_type: linear}}\n");
  EXPECT_DOUBLE_EQ(LearningRate(c, 0), 0.1 * 0.2);
  EXPECT_DOUBLE_EQ(LearningRate(c, 5), 0.1 * (0.2 + 0.5 * 0.8));
  auto cosine = [](int step) {
    const double ratio =
        (1 + std::cos(std::numbers::pi * (step - 10 + 1) / 100.0)) / 2;
    return 0.1 * std::max(0.0, 0.1 + 0.9 * ratio);
  };
  for (int step : {10, 30, 59, 109, 150}) {
    EXPECT_DOUBLE_EQ(LearningRate(c, step), cosine(step)) << step;
  }
  EXPECT_NEAR(LearningRate(c, 59), 0.1 * 0.55, 1e-15);  // cos(pi/2) = 0
  EXPECT_NEAR(LearningRate(c, 109), 0.1 * 0.1, 1e-15);  // the floor
  EXPECT_EQ(LearningRate(c, -1), 0.0);
  TrainConfig log = WithScheduler(
      "scheduler: {type: WarmupCosineLR, params: {total_num_steps: 100, "
      "warmup_num_steps: 1}}\n");  // DeepSpeed warms up at least 2 steps
  EXPECT_DOUBLE_EQ(LearningRate(log, 1), 0.1 * DsWarmupGamma(1, 1, true));
}

TEST(TrainConfig, NoSchedulerKeepsOptimizerLr) {
  TrainConfig c = WithScheduler("");
  EXPECT_EQ(LearningRate(c, -1), 0.1);
  EXPECT_EQ(LearningRate(c, 0), 0.1);
  EXPECT_EQ(LearningRate(c, 123456), 0.1);
}

}  // namespace
}  // namespace dslaunch::worker
