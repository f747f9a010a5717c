// The trainer on the GPU against the CPU engine, its reference (ctest label
// gpu; every test skips, saying why, where no GPU is visible): 50 fp32
// steps give the CPU engine's losses within 1e-4; two GPU runs are
// identical; bf16 stays within 2e-2 of fp32; fp16's loss scaling skips
// overflows; a GPU checkpoint resumes bit for bit; checkpoints move between
// CPU and GPU; two ranks sharing one GPU equal two CPU ranks; ZeRO stages
// 1-3 and the offloaded optimizer and parameters equal the CPU, and the GPU
// memory of each follows the ZeRO law.
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
#include "worker/cuda/nccl_comm.h"
#include "worker/data_loader.h"
#include "worker/device_loader.h"
#include "worker/param_layout.h"
#include "worker/partition.h"

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

  // 2 layers (or `layers`), 4 heads, C 64, T 64, V 500; micro batch 4.
  TrainConfig Config(int world, int64_t steps, const std::string& extra = "",
                     const std::string& zero = R"({"stage": 0})",
                     int layers = 2) {
    const std::string text =
        R"({"train_micro_batch_size_per_gpu": 4,
            "gradient_accumulation_steps": 2, "gradient_clipping": 1.0,
            "steps_per_print": 1000,
            "optimizer": {"type": "AdamW",
                          "params": {"lr": 0.003, "weight_decay": 0.1}},
            "zero_optimization": )" +
        zero + R"(,
            "model": {"n_layer": )" +
        std::to_string(layers) + R"(, "n_head": 4, "n_embd": 64,
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

// The fused attention kernels (bf16's default) train as the batched
// products (DSL_CUDA_ATTENTION=batched) do: 50 steps within 2e-2 of fp32,
// the same bits on a second run, and without the batched path's (B, NH, T,
// T) scores (a smaller GPU peak shows the fused path ran).
TEST_F(CudaTrainerTest, FusedAttentionTrainsLikeTheBatched) {
  const std::string bf16 = R"(, "bf16": {"enabled": true})";
  const Run fp32 = Train(Config(1, 50), DeviceKind::kCuda);
  ::setenv("DSL_CUDA_ATTENTION", "batched", 1);
  const Run batched = Train(Config(1, 50, bf16), DeviceKind::kCuda);
  ::unsetenv("DSL_CUDA_ATTENTION");
  const Run fused = Train(Config(1, 50, bf16), DeviceKind::kCuda);
  const Run again = Train(Config(1, 50, bf16), DeviceKind::kCuda);
  const float d = MaxDiff(fused.losses, fp32.losses);
  std::printf(
      "fused attention: 50 bf16 steps, loss %.6f -> %.6f (fp32 %.6f, "
      "batched %.6f), largest difference from fp32 %.3g; GPU peak %lld "
      "bytes (batched %lld)\n",
      fused.losses.front(), fused.losses.back(), fp32.losses.back(),
      batched.losses.back(), d, static_cast<long long>(fused.gpu_bytes),
      static_cast<long long>(batched.gpu_bytes));
  EXPECT_LT(d, 2e-2);
  EXPECT_EQ(fused.losses, again.losses);
  EXPECT_LT(fused.gpu_bytes, batched.gpu_bytes);
}

// The 16-bit modes keep the products' activations rounded (written so by
// the LayerNorms, GELU and attention): the same numbers as keeping them in
// fp32 and rounding before each product (DSL_CUDA_ACTIVATIONS=fp32), which
// only the products' own choice of algorithm may move in the last bits,
// and a smaller GPU peak, in bf16 and in fp16.
TEST_F(CudaTrainerTest, RoundedActivationsTrainAsTheFp32Ones) {
  for (const std::string mode :
       {R"(, "bf16": {"enabled": true})",
        R"(, "fp16": {"enabled": true, "initial_scale_power": 12})"}) {
    SCOPED_TRACE(mode);
    ::setenv("DSL_CUDA_ACTIVATIONS", "fp32", 1);
    const Run fp32 = Train(Config(1, 30, mode), DeviceKind::kCuda);
    ::setenv("DSL_CUDA_ACTIVATIONS", "16bit", 1);
    const Run rounded = Train(Config(1, 30, mode), DeviceKind::kCuda);
    ::unsetenv("DSL_CUDA_ACTIVATIONS");
    const Run by_default = Train(Config(1, 30, mode), DeviceKind::kCuda);
    ASSERT_EQ(rounded.losses.size(), 30u);
    const float d = MaxDiff(rounded.losses, fp32.losses);
    std::printf(
        "activations kept rounded: 30 steps, loss %.6f -> %.6f (fp32 "
        "activations %.6f), largest difference %.3g; GPU peak %lld bytes "
        "(fp32 activations %lld)\n",
        rounded.losses.front(), rounded.losses.back(), fp32.losses.back(), d,
        static_cast<long long>(rounded.gpu_bytes),
        static_cast<long long>(fp32.gpu_bytes));
    EXPECT_LT(d, 1e-4);
    EXPECT_LT(MaxDiff(rounded.params, fp32.params), 1e-4);
    EXPECT_LT(rounded.gpu_bytes, fp32.gpu_bytes);
    EXPECT_EQ(by_default.losses, rounded.losses);  // the default
  }
}

// A switch's value the engine does not know is refused, naming it, before
// anything trains (the copy streams' only where there are layer windows).
TEST_F(CudaTrainerTest, UnknownSwitchValuesAreRefused) {
  struct Case {
    const char* name;
    const char* value;
    const char* zero;
  };
  for (const Case& c :
       std::vector<Case>{{"DSL_CUDA_ACTIVATIONS", "bf8", R"({"stage": 0})"},
                         {"DSL_CUDA_ATTENTION", "flash", R"({"stage": 0})"},
                         {"DSL_CUDA_LT", "yes", R"({"stage": 0})"},
                         {"DSL_CUDA_COPY_STREAM", "2", R"({"stage": 2})"}}) {
    const std::string named = std::string(c.name) + "=" + c.value;
    SCOPED_TRACE(named);
    ::setenv(c.name, c.value, 1);
    LocalWorld w(1, std::chrono::seconds(60));
    const TrainConfig config =
        Config(1, 1, R"(, "bf16": {"enabled": true})", c.zero);
    std::vector<Status> st = RunRanks(w, [&](Comm& comm) -> Status {
      TrainOptions o;
      o.quiet = true;
      o.device = DeviceKind::kCuda;
      return Trainer::Create(config, Borrow(comm), o).status();
    });
    ::unsetenv(c.name);
    EXPECT_NE(st[0].ToString().find(named), std::string::npos)
        << st[0].ToString();
  }
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

// ZeRO stages 1-3 (the gradients reduce-scattered over Gloo, each rank's
// optimizer on its shard; under stages 2 and 3 layer by layer from windows
// during the backward pass, and under stage 3 each layer's parameters
// gathered into a window before it runs), the optimizer offloaded to the
// CPU (offload_optimizer: the host's fp32 master parameters and moments,
// the CPU's AdamW) and stage 3's parameters offloaded train as the CPU
// engine does: 2 ranks sharing the GPU, 20 fp32 steps. A small reduce
// bucket makes stages 2 and 3 reduce in several.
TEST_F(CudaTrainerTest, ZeroStagesAndOffloadEqualTheCpuEngine) {
  const Run cpu = Train(Config(2, 20), DeviceKind::kCpu, 2);
  for (const char* zero :
       {R"({"stage": 1})", R"({"stage": 2, "reduce_bucket_size": 60000})",
        R"({"stage": 3, "reduce_bucket_size": 60000})",
        R"({"stage": 0, "offload_optimizer": {"device": "cpu"}})",
        R"({"stage": 1, "offload_optimizer": {"device": "cpu"}})",
        R"({"stage": 2, "offload_optimizer": {"device": "cpu"}})",
        R"({"stage": 3, "offload_optimizer": {"device": "cpu"}})",
        R"({"stage": 3, "offload_optimizer": {"device": "cpu"},
            "offload_param": {"device": "cpu"}})"}) {
    SCOPED_TRACE(zero);
    const Run gpu = Train(Config(2, 20, "", zero), DeviceKind::kCuda, 2);
    ASSERT_EQ(gpu.losses.size(), 20u);
    EXPECT_LT(MaxDiff(gpu.losses, cpu.losses), 1e-4);
    EXPECT_LT(MaxDiff(gpu.params, cpu.params), 1e-3);
  }
}

// Stages 2 and 3 copy the layer windows on streams of their own, ordered
// against the compute by events: the same bits as the copies in line on
// the compute stream (DSL_CUDA_COPY_STREAM=0), with 2 and 3 layers (the
// last layer's window of either parity), the parameters offloaded too.
TEST_F(CudaTrainerTest, CopyStreamsChangeNoBit) {
  for (int layers : {2, 3}) {
    for (const char* zero :
         {R"({"stage": 2, "reduce_bucket_size": 60000})",
          R"({"stage": 3, "reduce_bucket_size": 60000})",
          R"({"stage": 3, "offload_param": {"device": "cpu"}})"}) {
      SCOPED_TRACE(std::string(zero) + ", layers " + std::to_string(layers));
      const TrainConfig c = Config(2, 10, "", zero, layers);
      ::setenv("DSL_CUDA_COPY_STREAM", "0", 1);
      const Run in_line = Train(c, DeviceKind::kCuda, 2);
      ::setenv("DSL_CUDA_COPY_STREAM", "1", 1);
      const Run streams = Train(c, DeviceKind::kCuda, 2);
      ::unsetenv("DSL_CUDA_COPY_STREAM");
      ASSERT_EQ(streams.losses.size(), 10u);
      EXPECT_EQ(streams.losses, in_line.losses);
      EXPECT_EQ(streams.params, in_line.params);
    }
  }
}

// The engine's NCCL path on one GPU (DSL_NCCL=1 takes it for one rank,
// whose collectives are copies): every stage, offloaded or not, equals
// the CPU engine as the Gloo path does, the device's window gathers and
// reduce-scatters included, and the summary names NCCL. Skipped where NCCL
// cannot load.
TEST_F(CudaTrainerTest, NcclOnOneRankEqualsTheCpuEngine) {
  cuda::NcclComm probe;
  if (!probe.Load()) GTEST_SKIP() << probe.error();
  const Run cpu = Train(Config(1, 20), DeviceKind::kCpu, 1);
  ::setenv("DSL_NCCL", "1", 1);
  for (const char* zero :
       {R"({"stage": 0})", R"({"stage": 1})", R"({"stage": 2})",
        R"({"stage": 3})",
        R"({"stage": 0, "offload_optimizer": {"device": "cpu"}})",
        R"({"stage": 1, "offload_optimizer": {"device": "cpu"}})",
        R"({"stage": 2, "offload_optimizer": {"device": "cpu"}})",
        R"({"stage": 3, "offload_optimizer": {"device": "cpu"}})",
        R"({"stage": 3, "offload_param": {"device": "cpu"}})"}) {
    SCOPED_TRACE(zero);
    const TrainConfig c = Config(1, 20, "", zero);
    LocalWorld w(1, std::chrono::seconds(120));
    std::unique_ptr<Comm> comm = w.MakeComm(0);
    TrainOptions o;
    o.quiet = true;
    o.device = DeviceKind::kCuda;
    auto t = Trainer::Create(c, std::move(comm), o);
    ASSERT_TRUE(t.ok()) << t.status().ToString();
    EXPECT_NE((*t)->Summary().find("collectives NCCL"), std::string::npos)
        << (*t)->Summary();
    std::vector<float> losses;
    while ((*t)->step() < c.train.steps) {
      auto r = (*t)->Step();
      ASSERT_TRUE(r.ok()) << r.status().ToString();
      losses.push_back(r->loss);
    }
    auto params = (*t)->WholeParams();
    ASSERT_TRUE(params.ok()) << params.status().ToString();
    EXPECT_LT(MaxDiff(losses, cpu.losses), 1e-4);
    EXPECT_LT(MaxDiff(*params, cpu.params), 1e-3);
  }
  ::unsetenv("DSL_NCCL");
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

// The memory each rank keeps follows the law, n parameters on 2 ranks.
// The device holds, besides the same activations in every mode:
//  - stage 0: fp32 parameters, gradients and both AdamW moments (16n);
//  - stage 1: the moments of its shard only (8n + 8 shard);
//  - stage 2: whole parameters, the owned pieces' gradients and moments
//    (o floats: each layer's shard) and a gradient window for the
//    embedding and two for the largest other layer, which the other layers
//    take by turns (4n + 12o + 4w);
//  - stage 3: the owned parameters too, and parameter windows as large
//    (16o + 8w);
//  - offloaded: none of the owned pieces or moments, which the host holds.
// The allocator's peak differs between modes by exactly those bytes; the
// model state (device and host) is each stage's law wherever it sits.
TEST_F(CudaTrainerTest, MemoryFollowsTheZeroLaw) {
  auto run = [this](const char* zero) {
    return Train(Config(2, 1, "", zero), DeviceKind::kCuda, 2);
  };
  const Run s0 = run(R"({"stage": 0})");
  const Run s1 = run(R"({"stage": 1})");
  const Run s2 = run(R"({"stage": 2})");
  const Run s3 = run(R"({"stage": 3})");
  const Run off1 =
      run(R"({"stage": 1, "offload_optimizer": {"device": "cpu"}})");
  const Run off2 =
      run(R"({"stage": 2, "offload_optimizer": {"device": "cpu"}})");
  const Run off3 =
      run(R"({"stage": 3, "offload_optimizer": {"device": "cpu"}})");
  const ParamLayout layout(ModelConfig::Make(64, 500, 2, 4, 64),
                           ParamOrder::kLayerMajor);
  const auto n = static_cast<int64_t>(layout.num_params());
  const auto shard = static_cast<int64_t>(MakePartition(n, 2).shard);
  int64_t owned = 0, block = 0;
  for (int l = -1; l <= 2; ++l) {
    const auto size = static_cast<int64_t>(layout.LayerRanges(l).at(0).size());
    owned += static_cast<int64_t>(MakePartition(size, 2).shard);
    if (l >= 0) block = std::max(block, size);
  }
  const int64_t windows =
      static_cast<int64_t>(layout.LayerRanges(-1).at(0).size()) + 2 * block;
  std::printf(
      "2 ranks, %lld parameters: GPU peak stage 0 %lld, stage 1 %lld, "
      "stage 2 %lld, stage 3 %lld; offloaded stage 1 %lld, stage 2 %lld, "
      "stage 3 %lld bytes\n",
      static_cast<long long>(n), static_cast<long long>(s0.gpu_bytes),
      static_cast<long long>(s1.gpu_bytes),
      static_cast<long long>(s2.gpu_bytes),
      static_cast<long long>(s3.gpu_bytes),
      static_cast<long long>(off1.gpu_bytes),
      static_cast<long long>(off2.gpu_bytes),
      static_cast<long long>(off3.gpu_bytes));
  EXPECT_EQ(s0.gpu_bytes - s1.gpu_bytes, 8 * (n - shard));
  EXPECT_EQ(s1.gpu_bytes - s2.gpu_bytes,
            (8 * n + 8 * shard) - (4 * n + 12 * owned + 4 * windows));
  EXPECT_EQ(s2.gpu_bytes - s3.gpu_bytes, 4 * n - 4 * owned - 4 * windows);
  EXPECT_EQ(s0.gpu_bytes - off1.gpu_bytes, 8 * n);
  EXPECT_EQ(s2.gpu_bytes - off2.gpu_bytes, 12 * owned);
  EXPECT_EQ(s3.gpu_bytes - off3.gpu_bytes, 16 * owned);
  EXPECT_EQ(s1.state_bytes, 8 * n + 8 * shard);
  EXPECT_EQ(off1.state_bytes, 8 * n + 8 * shard);  // moments on the host
  EXPECT_EQ(s2.state_bytes, 4 * n + 12 * owned);
  EXPECT_EQ(off2.state_bytes, 4 * n + 12 * owned);
  EXPECT_EQ(s3.state_bytes, 16 * owned);
  EXPECT_EQ(off3.state_bytes, 16 * owned);
}

}  // namespace
}  // namespace dslaunch::worker
