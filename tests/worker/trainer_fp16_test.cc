// The Trainer's fp16 loss scaling over an engine of the test's own: the loss
// times the scale, the gradients divided by it before the update, a step
// whose gradients overflow skipped (no update; AdamW's step count and the LR
// schedule count only the steps applied, as in DeepSpeed), the scale halved
// and doubled as DeepSpeed's DynamicLossScaler does, and all of it in the
// step results.
#include <gtest/gtest.h>
#include <stdlib.h>  // mkdtemp

#include <cmath>
#include <filesystem>
#include <limits>
#include <memory>
#include <vector>

#include "worker/comm_local.h"
#include "worker/data_loader.h"
#include "worker/lr_schedule.h"
#include "worker/trainer.h"

namespace dslaunch::worker {
namespace {

// Reports a gradient norm of 0.5 (unscaled) each step, infinite on the
// steps in `overflow` (1-based); records what the Trainer asks of it.
class ScriptedEngine final : public Engine {
 public:
  ScriptedEngine(const ModelConfig& mc, std::vector<int> overflow)
      : mc_(mc), overflow_(std::move(overflow)) {}
  const ModelConfig& model_config() const override { return mc_; }
  size_t num_params() const override { return 4; }
  Status ZeroGrad() override {
    ++step_;
    return Status::Ok();
  }
  StatusOr<float> TrainMicroBatch(const Batch&, float grad_scale) override {
    grad_scales.push_back(grad_scale);
    last_scale_ = grad_scale;
    return 2.5f;
  }
  StatusOr<float> EvalBatch(const Batch&) override { return 2.5f; }
  StatusOr<float> FinishGradients() override {
    for (int s : overflow_) {
      if (s == step_) return std::numeric_limits<float>::infinity();
    }
    return 0.5f * last_scale_;  // gradients of the scaled loss (gas 1)
  }
  Status Update(const AdamParams& adam, float clip_scale) override {
    updates.push_back({step_, adam.step, adam.lr, clip_scale});
    return Status::Ok();
  }
  StatusOr<RankShard> CheckpointRange(size_t, size_t) override {
    return RankShard{};
  }
  Status Resume(const std::string&) override { return Status::Ok(); }
  StatusOr<std::vector<float>> WholeParams() override {
    return std::vector<float>(4);
  }
  int64_t state_bytes() const override { return 64; }
  std::string Describe() const override { return "scripted"; }

  struct Call {
    int step;           // the Trainer's step
    int64_t adam_step;  // AdamW's count
    double lr;
    float clip_scale;
  };
  std::vector<Call> updates;
  std::vector<float> grad_scales;

 private:
  ModelConfig mc_;
  std::vector<int> overflow_;
  int step_ = 0;
  float last_scale_ = 1;
};

class TrainerFp16 : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string dir = ::testing::TempDir() + "dsl_fp16_XXXXXX";
    ASSERT_NE(::mkdtemp(dir.data()), nullptr);
    dir_ = dir;
    std::vector<uint16_t> tokens(4096);
    for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = i % 67;
    ASSERT_TRUE(WriteShard(dir_ + "/train.bin", tokens).ok());
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::string dir_;
};

TEST_F(TrainerFp16, SkipsOverflowedStepsAndCountsOnlyTheAppliedOnes) {
  const std::string text =
      R"({"train_micro_batch_size_per_gpu": 2, "gradient_clipping": 0,
          "steps_per_print": 1000,
          "fp16": {"enabled": true, "initial_scale_power": 4,
                   "loss_scale_window": 2, "hysteresis": 1},
          "optimizer": {"type": "AdamW", "params": {"lr": 0.01}},
          "scheduler": {"type": "WarmupLR",
                        "params": {"warmup_min_lr": 0, "warmup_max_lr": 0.01,
                                   "warmup_num_steps": 10}},
          "model": {"n_layer": 2, "n_head": 2, "n_embd": 16, "seq_len": 8,
                    "vocab_size": 67},
          "data": {"train": ")" +
      dir_ + R"(/train.bin", "shuffle": false}, "train": {"steps": 6}})";
  auto config = ParseTrainConfig(text, "fp16.json", 1);
  ASSERT_TRUE(config.ok()) << config.status().ToString();
  ScriptedEngine* engine = nullptr;
  TrainOptions o;
  o.quiet = true;
  o.make_engine =
      [&](const TrainConfig& c, Comm*,
          const EngineOptions&) -> StatusOr<std::unique_ptr<Engine>> {
    const ModelSection& m = c.model;
    auto e = std::make_unique<ScriptedEngine>(
        ModelConfig::Make(m.seq_len, m.vocab_size, m.n_layer, m.n_head,
                          m.n_embd),
        std::vector<int>{2, 3});
    engine = e.get();
    return std::unique_ptr<Engine>(std::move(e));
  };
  LocalWorld world(1);
  std::vector<StepResult> results;
  std::vector<ScriptedEngine::Call> updates;  // copied before the engine goes
  std::vector<float> grad_scales;
  std::vector<Status> st = RunRanks(world, [&](Comm& comm) -> Status {
    ASSIGN_OR_RETURN(auto t, Trainer::Create(*config, Borrow(comm), o));
    while (t->step() < 6) {
      ASSIGN_OR_RETURN(StepResult r, t->Step());
      results.push_back(r);
    }
    updates = engine->updates;
    grad_scales = engine->grad_scales;
    return Status::Ok();
  });
  ASSERT_TRUE(st[0].ok()) << st[0].ToString();
  // Scales: 16 (iter 0: no doubling yet), 16 overflows -> 8, 8 overflows
  // -> 4, then a window of 2 clean steps from the last overflow doubles.
  std::vector<double> scales;
  std::vector<bool> skipped;
  for (const StepResult& r : results) {
    scales.push_back(r.loss_scale);
    skipped.push_back(r.skipped);
  }
  EXPECT_EQ(scales, (std::vector<double>{16, 16, 8, 4, 4, 8}));
  EXPECT_EQ(skipped,
            (std::vector<bool>{false, true, true, false, false, false}));
  EXPECT_EQ(grad_scales,
            (std::vector<float>{16, 16, 8, 4, 4, 8}));  // the loss times it
  // Four updates: AdamW counts 1..4 and the LR schedule its first four
  // rates; each with the gradients divided by the scale.
  ASSERT_EQ(updates.size(), 4u);
  const int want_steps[] = {1, 4, 5, 6};
  for (size_t i = 0; i < 4; ++i) {
    const auto& u = updates[i];
    EXPECT_EQ(u.step, want_steps[i]);
    EXPECT_EQ(u.adam_step, static_cast<int64_t>(i + 1));
    EXPECT_DOUBLE_EQ(u.lr, LearningRate(*config, static_cast<int64_t>(i)));
    EXPECT_FLOAT_EQ(u.clip_scale,
                    1.0f / static_cast<float>(scales[want_steps[i] - 1]));
  }
  // The norm reported is the unscaled one; an overflowed step's is not finite.
  EXPECT_FLOAT_EQ(results[0].grad_norm, 0.5f);
  EXPECT_FALSE(std::isfinite(results[1].grad_norm));
}

}  // namespace
}  // namespace dslaunch::worker
