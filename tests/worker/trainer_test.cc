// Trainer at 1-4 ranks as threads over LocalWorld (no Gloo): ZeRO stages
// 0-3 train to the same parameters, the bytes each stage keeps, a checkpoint
// resumes exactly, and a lost peer is a Status. The tiny model (2 layers,
// C 16, T 8) trains on a generated token shard.
#include "worker/trainer.h"

#include <gtest/gtest.h>
#include <omp.h>       // omp_set_num_threads
#include <stdlib.h>    // mkdtemp
#include <sys/stat.h>  // umask

#include <chrono>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "worker/comm_local.h"
#include "worker/data_loader.h"
#include "worker/engine.h"
#include "worker/param_layout.h"
#include "worker/partition.h"

namespace dslaunch::worker {
namespace {

class TrainerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string dir = ::testing::TempDir() + "dsl_trainer_XXXXXX";
    ASSERT_NE(::mkdtemp(dir.data()), nullptr);
    dir_ = dir;
    std::vector<uint16_t> tokens(4096);
    uint32_t x = 12345;
    for (auto& t : tokens) {
      x = x * 1103515245u + 12345u;
      t = static_cast<uint16_t>((x >> 16) % 67);
    }
    ASSERT_TRUE(WriteShard(dir_ + "/train.bin", tokens).ok());
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  // A config for `world` ranks: micro batch 2, `gas` accumulation steps.
  TrainConfig Config(int world, int stage, int64_t steps, int gas = 1,
                     int64_t bucket = 500000000, double clip = 0,
                     const std::string& extra = "") {
    const std::string text =
        R"({"train_micro_batch_size_per_gpu": 2,
            "gradient_accumulation_steps": )" +
        std::to_string(gas) + R"(, "gradient_clipping": )" +
        std::to_string(clip) + R"(, "steps_per_print": 1000,
            "optimizer": {"type": "AdamW",
                          "params": {"lr": 0.01, "weight_decay": 0.1}},
            "zero_optimization": {"stage": )" +
        std::to_string(stage) + R"(, "reduce_bucket_size": )" +
        std::to_string(bucket) + R"(},
            "model": {"n_layer": 2, "n_head": 2, "n_embd": 16,
                      "seq_len": 8, "vocab_size": 67},
            "data": {"train": ")" +
        dir_ + R"(/train.bin", "shuffle": false},
            "train": {"steps": )" +
        std::to_string(steps) + R"(, "seed": 7})" + extra + "}";
    auto c = ParseTrainConfig(text, "test.json", world);
    EXPECT_TRUE(c.ok()) << c.status().ToString();
    return c.ok() ? *c : TrainConfig{};
  }

  struct RankResult {
    std::vector<float> params;  // llm.c order
    int64_t state_bytes = 0;
    StepResult last;
  };

  // Runs config.train.steps steps on every rank of `w`; the whole
  // parameters each rank ends with.
  std::vector<RankResult> Train(LocalWorld& w, const TrainConfig& config,
                                std::vector<Status>* statuses = nullptr) {
    std::vector<RankResult> out(w.size());
    std::vector<Status> st = RunRanks(w, [&](Comm& comm) -> Status {
      const int r = comm.rank();
      omp_set_num_threads(1);  // the ranks are threads already
      ASSIGN_OR_RETURN(auto t, Trainer::Create(config, Borrow(comm),
                                               TrainOptions{"", true}));
      out[r].state_bytes = t->model_state_bytes();
      while (t->step() < config.train.steps) {
        ASSIGN_OR_RETURN(out[r].last, t->Step());
      }
      ASSIGN_OR_RETURN(out[r].params, t->WholeParams());
      return Status::Ok();
    });
    if (statuses) {
      *statuses = st;
    } else {
      for (size_t r = 0; r < st.size(); ++r)
        EXPECT_TRUE(st[r].ok()) << "rank " << r << ": " << st[r].ToString();
    }
    return out;
  }

  // Runs Trainer::Run (which saves checkpoints) on every rank.
  void RunAll(LocalWorld& w, const TrainConfig& config) {
    std::vector<Status> st = RunRanks(w, [&](Comm& comm) -> Status {
      omp_set_num_threads(1);
      ASSIGN_OR_RETURN(auto t, Trainer::Create(config, Borrow(comm),
                                               TrainOptions{"", true}));
      return t->Run().status();
    });
    for (size_t r = 0; r < st.size(); ++r)
      EXPECT_TRUE(st[r].ok()) << "rank " << r << ": " << st[r].ToString();
  }

  std::string dir_;
};

size_t Differences(const std::vector<float>& a, const std::vector<float>& b) {
  size_t n = 0;
  for (size_t i = 0; i < a.size(); ++i) n += a[i] != b[i];
  return n;
}

float MaxAbsDiff(const std::vector<float>& a, const std::vector<float>& b) {
  float worst = 0;
  for (size_t i = 0; i < a.size(); ++i)
    worst = std::max(worst, std::abs(a[i] - b[i]));
  return worst;
}

// At 1 and 2 ranks every stage adds each gradient element once (a + b), so
// the stages differ only in where state lives: bit-identical parameters.
TEST_F(TrainerTest, EveryStageTrainsToTheSameBitsAtOneAndTwoRanks) {
  for (int world : {1, 2}) {
    LocalWorld w0(world);
    const auto ref = Train(w0, Config(world, 0, 3));
    for (int r = 1; r < world; ++r)
      EXPECT_EQ(Differences(ref[r].params, ref[0].params), 0u);
    for (int stage : {1, 2, 3}) {
      for (int64_t bucket : {int64_t{1}, int64_t{3000}, int64_t{500000000}}) {
        if (stage < 2 && bucket != 500000000) continue;
        LocalWorld w(world);
        const auto got = Train(w, Config(world, stage, 3, 1, bucket));
        for (int r = 0; r < world; ++r) {
          EXPECT_EQ(Differences(got[r].params, ref[0].params), 0u)
              << "world " << world << " stage " << stage << " bucket " << bucket
              << " rank " << r;
        }
      }
    }
  }
}

// From 3 ranks on the stages add the ranks' gradients in different orders
// (stage 0 all-reduces; stages 1-3 reduce-scatter around the ring, each
// element starting at a different rank), so they agree to rounding: after
// 3 AdamW steps at lr 0.01, within 1e-5 absolute (a thousandth of one
// step's size; Adam scales each element's step to about lr whatever its
// gradient, so near-zero gradients carry their rounding into the step).
// Against one rank accumulating the same batches (measured: 4e-6).
TEST_F(TrainerTest, StagesAtFourRanksMatchOneRankAccumulatingTheSameBatches) {
  LocalWorld w1(1);
  const auto ref = Train(w1, Config(1, 0, 3, /*gas=*/4));
  for (int stage : {0, 1, 2, 3}) {
    LocalWorld w(4);
    const auto got = Train(w, Config(4, stage, 3, 1, 3000));
    for (int r = 0; r < 4; ++r) {
      EXPECT_EQ(Differences(got[r].params, got[0].params), 0u) << r;
    }
    EXPECT_LT(MaxAbsDiff(got[0].params, ref[0].params), 1e-5f) << stage;
    EXPECT_NEAR(got[0].last.loss, ref[0].last.loss, 1e-5f) << stage;
  }
  LocalWorld w0(1);
  const auto init = Train(w0, Config(1, 0, 0));
  EXPECT_GT(Differences(ref[0].params, init[0].params),
            ref[0].params.size() / 2);  // the steps moved the parameters
}

TEST_F(TrainerTest, ModelStateBytesShrinkWithEachStage) {
  const int64_t n =
      ParamLayout(ModelConfig::Make(8, 67, 2, 2, 16), ParamOrder::kLlmc)
          .num_params();
  std::vector<int64_t> bytes;
  for (int stage : {0, 1, 2, 3}) {
    LocalWorld w(4);
    const auto got = Train(w, Config(4, stage, 0));
    bytes.push_back(got[0].state_bytes);
  }
  const int64_t padded = static_cast<int64_t>(MakePartition(n, 4).padded());
  EXPECT_EQ(bytes[0], 4 * (2 * padded + 2 * n));           // all of everything
  EXPECT_EQ(bytes[1], 4 * (2 * padded + 2 * padded / 4));  // moments split
  EXPECT_LT(bytes[2], bytes[1]);  // gradients split too
  EXPECT_LT(bytes[3], bytes[2]);  // and parameters
  EXPECT_LT(bytes[3], bytes[0] / 3);
}

TEST_F(TrainerTest, ResumingACheckpointGivesTheUninterruptedRunsBits) {
  for (int stage : {1, 3}) {
    const std::string ckpt = dir_ + "/ckpt" + std::to_string(stage);
    LocalWorld straight(2);
    const auto want = Train(straight, Config(2, stage, 4));
    const std::string save = R"(, "checkpoint": {"dir": ")" + ckpt +
                             R"(", "every": 2, "resume": "latest"})";
    LocalWorld first(2), second(2);
    RunAll(first, Config(2, stage, 2, 1, 500000000, 0, save));
    const auto got = Train(second, Config(2, stage, 4, 1, 500000000, 0, save));
    for (int r = 0; r < 2; ++r)
      EXPECT_EQ(Differences(got[r].params, want[r].params), 0u) << stage;
  }
}

// Ranks may run as different users of one group (OpenShift: one arbitrary
// UID per pod, GID 0), all writing into one checkpoint directory: the ones
// dsworker makes are group-writable whatever the umask; one that was there
// keeps its mode.
TEST_F(TrainerTest, CheckpointDirectoriesItMakesAreGroupWritable) {
  const mode_t old_umask = ::umask(022);
  const std::string root = dir_ + "/shared/ckpt";
  LocalWorld w(2);
  RunAll(w,
         Config(2, 1, 2, 1, 500000000, 0,
                R"(, "checkpoint": {"dir": ")" + root + R"(", "every": 2})"));
  ::umask(old_umask);
  auto mode = [](const std::string& p) {
    return std::filesystem::status(p).permissions();
  };
  using std::filesystem::perms;
  EXPECT_EQ(mode(root) & perms::group_all, perms::group_all);
  EXPECT_EQ(mode(root + "/step_00000002") & perms::group_all, perms::group_all);
  EXPECT_EQ(mode(dir_) & perms::group_write, perms::none)
      << "not ours to change";
}

TEST_F(TrainerTest, ALostPeerIsAStatusFromStepOnEveryRank) {
  for (int stage : {0, 1, 2, 3}) {
    LocalWorld w(3, std::chrono::seconds(5));
    w.FailAt(2, 4);
    std::vector<Status> st;
    Train(w, Config(3, stage, 3), &st);
    for (int r = 0; r < 3; ++r) {
      EXPECT_EQ(st[r].code(), StatusCode::kUnavailable) << stage << " " << r;
      EXPECT_NE(st[r].message().find("rank 2 lost its connection"),
                std::string::npos)
          << st[r].message();
    }
  }
}

// The GPU engine takes every ZeRO stage, with or without offload: none is
// refused for its stage, and on a machine without a GPU the reason is the
// missing GPU or CUDA library, named as such. (gpu_engine_host_test.cc trains
// them all on a CPU stand-in.)
TEST_F(TrainerTest, TheGpuEngineTakesEveryStage) {
  LocalWorld w(1, std::chrono::seconds(5));
  std::unique_ptr<Comm> comm = w.MakeComm(0);
  EngineOptions o;
  o.device = DeviceKind::kCuda;
  for (int stage : {0, 1, 2, 3}) {
    for (bool offload : {false, true}) {
      TrainConfig c = Config(1, stage, 1);
      if (offload) c.zero.offload_optimizer = OffloadDevice::kCpu;
      auto got = MakeEngine(c, comm.get(), o);
      if (got.ok()) continue;  // a GPU is here
      EXPECT_EQ(got.status().message().find("zero_optimization"),
                std::string::npos)
          << got.status().message();
      EXPECT_NE(got.status().message().find("CUDA"), std::string::npos)
          << got.status().message();
    }
  }
}

}  // namespace
}  // namespace dslaunch::worker
