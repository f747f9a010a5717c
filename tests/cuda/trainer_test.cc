// The trainer on the GPU against the CPU engine, its reference (ctest label
// gpu; every test skips, saying why, where no GPU is visible): 50 fp32
// steps give the CPU engine's losses within 1e-4; two GPU runs are
// identical; bf16 stays within 2e-2 of fp32; fp16's loss scaling skips
// overflows; a GPU checkpoint resumes bit for bit; checkpoints move between
// CPU and GPU; two ranks sharing one GPU equal two CPU ranks; ZeRO stages
// 1-2 and the offloaded optimizer equal the CPU, and the GPU memory of each
// follows the ZeRO law.
#include "worker/trainer.h"

#include <gtest/gtest.h>
#include <omp.h>
#include <stdlib.h>  // mkdtemp

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "worker/comm_local.h"
#include "worker/data_loader.h"
#include "worker/device_loader.h"

namespace dslaunch::worker {
namespace {

bool HaveGpu(std::string* why) { return CudaDeviceCount(why) > 0; }

class CudaTrainerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string why;
    if (!HaveGpu(&why)) GTEST_SKIP() << "no GPU: " << why;
    std::string dir = ::testing::TempDir() + "dsl_cuda_trainer_XXXXXX";
    ASSERT_NE(::mkdtemp(dir.data()), nullptr);
    dir_ = dir;
    // Learnable text: the next token follows from the last one 7 times in
    // 8, else it is random (on pure noise the losses would not fall, and
    // the two engines' tiny differences would grow chaotically).
    std::vector<uint16_t> tokens(1 << 16);
    uint32_t x = 12345, t = 1;
    for (auto& out : tokens) {
      x = x * 1103515245u + 12345u;
      t = (x >> 16) % 8 == 0 ? (x >> 20) % 500 : (3 * t + 7) % 500;
      out = static_cast<uint16_t>(t);
    }
    ASSERT_TRUE(WriteShard(dir_ + "/train.bin", tokens).ok());
  }
  void TearDown() override {
    if (!dir_.empty()) std::filesystem::remove_all(dir_);
  }

  // 2 layers, 4 heads, C 64, T 64, V 500; micro batch 4.
  TrainConfig Config(int world, int64_t steps, const std::string& extra = "",
                     const std::string& zero = R"({"stage": 0})") {
    const std::string text =
        R"({"train_micro_batch_size_per_gpu": 4,
            "gradient_accumulation_steps": 2, "gradient_clipping": 1.0,
            "steps_per_print": 1000,
            "optimizer": {"type": "AdamW",
                          "params": {"lr": 0.003, "weight_decay": 0.1}},
            "zero_optimization": )" +
        zero + R"(,
            "model": {"n_layer": 2, "n_head": 4, "n_embd": 64,
                      "seq_len": 64, "vocab_size": 500},
            "data": {"train": ")" +
        dir_ + R"(/train.bin", "shuffle": false},
            "train": {"steps": )" +
        std::to_string(steps) + R"(, "seed": 7})" + extra + "}";
    auto c = ParseTrainConfig(text, "test.json", world);
    EXPECT_TRUE(c.ok()) << c.status().ToString();
    return c.ok() ? *c : TrainConfig{};
  }

  struct Run {
    std::vector<float> losses;               // rank 0's, per step
    std::vector<float> params;               // at the end, llm.c order
    int64_t state_bytes = 0, gpu_bytes = 0;  // rank 0's model state, GPU peak
  };

  // config.train.steps steps on `world` ranks (threads) on `device`;
  // with checkpoints saved by Run() where the config says.
  Run Train(const TrainConfig& config, DeviceKind device, int world = 1,
            bool use_run = false) {
    LocalWorld w(world, std::chrono::seconds(120));
    Run out;
    std::vector<Status> st = RunRanks(w, [&](Comm& comm) -> Status {
      omp_set_num_threads(1);
      TrainOptions o;
      o.quiet = true;
      o.device = device;
      o.local_rank = 0;  // ranks share GPU 0
      ASSIGN_OR_RETURN(auto t, Trainer::Create(config, Borrow(comm), o));
      std::vector<float> losses;
      if (use_run) {
        ASSIGN_OR_RETURN(StepResult r, t->Run());
        losses.push_back(r.loss);
      } else {
        while (t->step() < config.train.steps) {
          ASSIGN_OR_RETURN(StepResult r, t->Step());
          losses.push_back(r.loss);
        }
      }
      ASSIGN_OR_RETURN(auto params, t->WholeParams());
      if (comm.rank() == 0) {
        out.losses = losses;
        out.params = params;
        out.state_bytes = t->model_state_bytes();
        out.gpu_bytes = t->device_memory_bytes();
      }
      return Status::Ok();
    });
    for (size_t r = 0; r < st.size(); ++r)
      EXPECT_TRUE(st[r].ok()) << "rank " << r << ": " << st[r].ToString();
    return out;
  }

  static float MaxDiff(const std::vector<float>& a,
                       const std::vector<float>& b) {
    EXPECT_EQ(a.size(), b.size());
    float d = 0;
    for (size_t i = 0; i < a.size() && i < b.size(); i++)
      d = std::max(d, std::fabs(a[i] - b[i]));
    return d;
  }

  std::string dir_;
};

TEST_F(CudaTrainerTest, Fp32EqualsTheCpuEngine) {
  const TrainConfig c = Config(1, 50);
  const Run cpu = Train(c, DeviceKind::kCpu);
  const Run gpu = Train(c, DeviceKind::kCuda);
  ASSERT_EQ(gpu.losses.size(), 50u);
  const float d = MaxDiff(gpu.losses, cpu.losses);
  std::printf(
      "fp32: 50 steps, loss %.6f -> %.6f on the CPU, %.6f -> %.6f on "
      "the GPU, largest difference %.3g\n",
      cpu.losses.front(), cpu.losses.back(), gpu.losses.front(),
      gpu.losses.back(), d);
  EXPECT_LT(d, 1e-4);
  EXPECT_LT(cpu.losses.back(), cpu.losses.front() - 0.5f);  // it learns
}

TEST_F(CudaTrainerTest, DeterministicRunToRun) {
  const TrainConfig c = Config(1, 20);
  const Run a = Train(c, DeviceKind::kCuda);
  const Run b = Train(c, DeviceKind::kCuda);
  EXPECT_EQ(a.losses, b.losses);
  EXPECT_EQ(a.params, b.params);
}

TEST_F(CudaTrainerTest, Bf16StaysCloseToFp32) {
  const Run fp32 = Train(Config(1, 50), DeviceKind::kCuda);
  const Run bf16 =
      Train(Config(1, 50, R"(, "bf16": {"enabled": true})"), DeviceKind::kCuda);
  const float d = MaxDiff(bf16.losses, fp32.losses);
  std::printf(
      "bf16: 50 steps, loss %.6f -> %.6f (fp32 %.6f), largest "
      "difference %.3g\n",
      bf16.losses.front(), bf16.losses.back(), fp32.losses.back(), d);
  EXPECT_LT(d, 2e-2);
  EXPECT_GT(d, 0.0f);  // it really computed in bf16
}

// fp16 with DeepSpeed's dynamic loss scaling, started too high on purpose
// (2^24: the scaled gradients overflow fp16's 65504): the first steps are
// skipped while the scale halves, then it trains like fp32.
TEST_F(CudaTrainerTest, Fp16SkipsOverflowsAndTrains) {
  const Run fp32 = Train(Config(1, 50), DeviceKind::kCuda);
  const TrainConfig c =
      Config(1, 50,
             R"(, "fp16": {"enabled": true, "initial_scale_power": 24,
                     "loss_scale_window": 100})");
  LocalWorld w(1, std::chrono::seconds(120));
  std::vector<StepResult> steps;
  std::vector<Status> st = RunRanks(w, [&](Comm& comm) -> Status {
    TrainOptions o;
    o.quiet = true;
    o.device = DeviceKind::kCuda;
    ASSIGN_OR_RETURN(auto t, Trainer::Create(c, Borrow(comm), o));
    while (t->step() < c.train.steps) {
      ASSIGN_OR_RETURN(StepResult r, t->Step());
      steps.push_back(r);
    }
    return Status::Ok();
  });
  ASSERT_TRUE(st[0].ok()) << st[0].ToString();
  int skipped = 0;
  for (const StepResult& r : steps) skipped += r.skipped ? 1 : 0;
  std::printf(
      "fp16: %d of 50 steps skipped, scale %g at the end, loss "
      "%.6f (fp32 %.6f)\n",
      skipped, steps.back().loss_scale, steps.back().loss, fp32.losses.back());
  EXPECT_GE(skipped, 1);
  EXPECT_LT(skipped, 20);
  EXPECT_LT(steps.back().loss_scale, 16777216.0);
  EXPECT_LT(steps.back().loss, steps.front().loss - 0.5f);  // it learns
}

TEST_F(CudaTrainerTest, ResumesBitForBit) {
  const std::string ck =
      R"(, "checkpoint": {"dir": ")" + dir_ + R"(/ck", "every": 10})";
  const Run whole = Train(Config(1, 20, ck), DeviceKind::kCuda, 1, true);
  const Run resumed = Train(
      Config(1, 20,
             R"(, "checkpoint": {"dir": ")" + dir_ + R"(/ck2", "resume": ")" +
                 dir_ + R"(/ck/step_00000010"})"),
      DeviceKind::kCuda, 1, true);
  EXPECT_EQ(resumed.losses, whole.losses);
  EXPECT_EQ(resumed.params, whole.params);
}

TEST_F(CudaTrainerTest, CheckpointsMoveBetweenCpuAndGpu) {
  const std::string ck =
      R"(, "checkpoint": {"dir": ")" + dir_ + R"(/ck", "every": 10})";
  const Run cpu = Train(Config(1, 20, ck), DeviceKind::kCpu, 1, true);
  const std::string resume = R"(, "checkpoint": {"dir": ")" + dir_ +
                             R"(/other", "resume": ")" + dir_ +
                             R"(/ck/step_00000010"})";
  const Run gpu = Train(Config(1, 20, resume), DeviceKind::kCuda, 1, true);
  EXPECT_LT(MaxDiff(gpu.losses, cpu.losses), 1e-4);
  EXPECT_LT(MaxDiff(gpu.params, cpu.params), 1e-3);
  // And a GPU checkpoint on the CPU.
  std::filesystem::remove_all(dir_ + "/ck");
  const Run gpu2 = Train(Config(1, 20, ck), DeviceKind::kCuda, 1, true);
  const Run cpu2 = Train(Config(1, 20, resume), DeviceKind::kCpu, 1, true);
  EXPECT_LT(MaxDiff(cpu2.losses, gpu2.losses), 1e-4);
}

TEST_F(CudaTrainerTest, TwoRanksShareOneGpu) {
  const TrainConfig c = Config(2, 20);
  const Run cpu = Train(c, DeviceKind::kCpu, 2);
  const Run gpu = Train(c, DeviceKind::kCuda, 2);
  EXPECT_LT(MaxDiff(gpu.losses, cpu.losses), 1e-4);
}

// ZeRO stages 1 and 2 (the gradients reduce-scattered over Gloo, each
// rank's optimizer on its shard) and the optimizer offloaded to the CPU
// (offload_optimizer: the host's fp32 master parameters and moments, the
// CPU's AdamW) train as the CPU engine does: 2 ranks sharing the GPU, 20
// fp32 steps.
TEST_F(CudaTrainerTest, ZeroStagesAndOffloadEqualTheCpuEngine) {
  const Run cpu = Train(Config(2, 20), DeviceKind::kCpu, 2);
  for (const char* zero :
       {R"({"stage": 1})", R"({"stage": 2})",
        R"({"stage": 0, "offload_optimizer": {"device": "cpu"}})",
        R"({"stage": 1, "offload_optimizer": {"device": "cpu"}})",
        R"({"stage": 2, "offload_optimizer": {"device": "cpu"}})"}) {
    SCOPED_TRACE(zero);
    const Run gpu = Train(Config(2, 20, "", zero), DeviceKind::kCuda, 2);
    ASSERT_EQ(gpu.losses.size(), 20u);
    EXPECT_LT(MaxDiff(gpu.losses, cpu.losses), 1e-4);
    EXPECT_LT(MaxDiff(gpu.params, cpu.params), 1e-3);
  }
}

// One rank offloaded: the same as on the device, and bit for bit after a
// resume (the master parameters and moments are the host's).
TEST_F(CudaTrainerTest, OffloadOnOneRankResumesBitForBit) {
  const std::string offload =
      R"({"stage": 2, "offload_optimizer": {"device": "cpu"}})";
  const Run device = Train(Config(1, 20), DeviceKind::kCuda, 1, true);
  const std::string ck =
      R"(, "checkpoint": {"dir": ")" + dir_ + R"(/ck", "every": 10})";
  const Run whole =
      Train(Config(1, 20, ck, offload), DeviceKind::kCuda, 1, true);
  EXPECT_LT(MaxDiff(whole.losses, device.losses), 1e-4);  // the last step's
  EXPECT_LT(MaxDiff(whole.params, device.params), 1e-3);
  const Run resumed = Train(
      Config(1, 20,
             R"(, "checkpoint": {"dir": ")" + dir_ + R"(/ck2", "resume": ")" +
                 dir_ + R"(/ck/step_00000010"})",
             offload),
      DeviceKind::kCuda, 1, true);
  EXPECT_EQ(resumed.losses, whole.losses);
  EXPECT_EQ(resumed.params, whole.params);
}

// The memory each rank keeps follows the law. The device holds fp32
// parameters and gradients (8 bytes a parameter) and the AdamW moments of
// its part (8 bytes a parameter of it): all of them under stage 0, its
// shard under stages 1 and 2 (rank 0 of 2: the first half, padded to 16),
// none offloaded. The GPU's allocator peak differs by exactly those bytes,
// the activations being the same; the model state counts the host's
// moments where they are offloaded.
TEST_F(CudaTrainerTest, MemoryFollowsTheZeroLaw) {
  const Run s0 = Train(Config(2, 1), DeviceKind::kCuda, 2);
  const Run s1 =
      Train(Config(2, 1, "", R"({"stage": 1})"), DeviceKind::kCuda, 2);
  const Run s2 =
      Train(Config(2, 1, "", R"({"stage": 2})"), DeviceKind::kCuda, 2);
  const Run off =
      Train(Config(2, 1, "",
                   R"({"stage": 1, "offload_optimizer": {"device": "cpu"}})"),
            DeviceKind::kCuda, 2);
  const int64_t n = s0.state_bytes / 16;
  const int64_t shard = (n / 2 + (n % 2) + 15) / 16 * 16;  // rank 0's
  std::printf(
      "2 ranks, %lld parameters: GPU peak stage 0 %lld, stage 1 %lld, "
      "stage 2 %lld, stage 1 offloaded %lld bytes\n",
      static_cast<long long>(n), static_cast<long long>(s0.gpu_bytes),
      static_cast<long long>(s1.gpu_bytes),
      static_cast<long long>(s2.gpu_bytes),
      static_cast<long long>(off.gpu_bytes));
  EXPECT_EQ(s0.gpu_bytes - s1.gpu_bytes, 8 * (n - shard));
  EXPECT_EQ(s2.gpu_bytes, s1.gpu_bytes);  // whole gradients for backward
  EXPECT_EQ(s0.gpu_bytes - off.gpu_bytes, 8 * n);
  EXPECT_EQ(s1.state_bytes, 8 * n + 8 * shard);
  EXPECT_EQ(off.state_bytes, 8 * n + 8 * shard);  // moments on the host
}

}  // namespace
}  // namespace dslaunch::worker
