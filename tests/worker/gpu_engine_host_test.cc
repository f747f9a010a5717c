// The GPU engines' host side (worker/gpu/: ZeRO stages 0-3, the
// optimizer on the device or offloaded, the parameters offloaded under
// stage 3, layer windows and hooks, checkpoints, resume) on machines without
// a GPU: the DeviceEngine is a stand-in (cpu_stand_in.h) that computes on the
// CPU with the CPU engine's own Model and AdamW, so every result must equal the
// CPU engine's bit for bit. On a GPU, tests/cuda/trainer_test.cc runs the same
// configs on the CUDA engine against the CPU within stated tolerances.
#include <gtest/gtest.h>
#include <stdlib.h>  // mkdtemp

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "tests/worker/cpu_stand_in.h"
#include "tests/worker/gpu_engine_host_fixture.h"
#include "worker/checkpoint.h"
#include "worker/comm_local.h"
#include "worker/device_engine.h"
#include "worker/engine.h"
#include "worker/partition.h"
#include "worker/train_config.h"

namespace dslaunch::worker {
namespace {

// At 1, 2 and 3 ranks (3: the partitions padded), over Gloo and, with a
// GPU per rank, over the GPUs' collectives.
TEST_F(GpuEngineHostTest, EveryStageAndOffloadEqualTheCpuEngineBitForBit) {
  for (int world : {1, 2, 3}) {
    for (int stage : {0, 1, 2, 3}) {
      const Result cpu = Train(Config(world, stage), false, world);
      ASSERT_EQ(cpu.norms.size(), 4u);
      for (Offload offload : Offloads(stage)) {
        for (bool nccl : {false, true}) {
          if (nccl && world == 1) continue;
          SCOPED_TRACE("world " + std::to_string(world) + ", stage " +
                       std::to_string(stage) + Name(offload) +
                       (nccl ? ", NCCL" : ""));
          if (nccl) gpus_ = "gpu";
          CpuStandIn::collectives = 0;
          const Result gpu = Train(Config(world, stage, offload), true, world);
          gpus_.reset();
          EXPECT_EQ(CpuStandIn::collectives > 0, nccl);
          EXPECT_EQ(gpu.norms, cpu.norms);
          EXPECT_EQ(gpu.params, cpu.params);
          EXPECT_EQ(gpu.eval, cpu.eval);
          EXPECT_EQ(gpu.ck_params, cpu.ck_params);
          EXPECT_EQ(gpu.ck_m, cpu.ck_m);
          EXPECT_EQ(gpu.ck_v, cpu.ck_v);
          // Each rank's whole state is the CPU engine's at the stage.
          EXPECT_EQ(gpu.state_bytes, cpu.state_bytes);
          // And every copy between host and device used pinned memory.
          EXPECT_EQ(CpuStandIn::unpinned_copies.exchange(0), 0);
        }
      }
    }
  }
}

// Offloaded with NCCL, a rank whose GPU cannot take the owned buffers the
// collectives need stops every rank's start at once, each saying which
// rank and why, instead of the others waiting on it in a collective.
TEST_F(GpuEngineHostTest, ARankWithoutRoomForTheOwnedBuffersStopsEveryRank) {
  for (int stage : {2, 3}) {
    SCOPED_TRACE("stage " + std::to_string(stage));
    LocalWorld w(2, std::chrono::seconds(30));
    CpuStandIn::no_memory_rank = 1;
    const auto start = std::chrono::steady_clock::now();
    std::vector<Status> st = RunRanks(w, [&](Comm& comm) -> Status {
      EngineOptions o;
      o.device = DeviceKind::kCuda;
      return MakeGpuEngine(Config(2, stage, kOptimizer), &comm, o,
                           CpuStandIn::WithCollectives(&comm, "gpu"))
          .status();
    });
    CpuStandIn::no_memory_rank = -1;
    EXPECT_LT(std::chrono::steady_clock::now() - start,
              std::chrono::seconds(10));
    ASSERT_FALSE(st[0].ok());
    ASSERT_FALSE(st[1].ok());
    EXPECT_NE(st[0].message().find("rank 1 could not allocate the owned "
                                   "buffers NCCL's collectives need"),
              std::string::npos)
        << st[0].ToString();
    EXPECT_EQ(st[1].message(), "GPU: out of memory in this stand-in")
        << st[1].ToString();
  }
}

// A checkpoint of the CPU engine after 2 steps resumes on the GPU engine in
// every mode, and 2 more steps there equal 4 on the CPU; a checkpoint the
// GPU engine writes after 2 steps resumes on the CPU engine the same way.
TEST_F(GpuEngineHostTest, CheckpointsMoveBetweenTheEngines) {
  std::string dir = ::testing::TempDir() + "dsl_gpu_host_XXXXXX";
  ASSERT_NE(::mkdtemp(dir.data()), nullptr);
  auto two_steps = [this](int stage, Offload offload) {
    TrainConfig c = Config(2, stage, offload);
    c.train.steps = 2;
    return c;
  };
  for (int stage : {0, 1, 2, 3}) {
    const Result straight = Train(Config(2, stage), false, 2);
    const std::string cpu_root = dir + "/cpu" + std::to_string(stage);
    Train(two_steps(stage, kNothing), false, 2, 0, "", cpu_root);
    for (Offload offload : Offloads(stage)) {
      for (bool nccl : {false, true}) {
        SCOPED_TRACE("stage " + std::to_string(stage) + Name(offload) +
                     (nccl ? ", NCCL" : ""));
        if (nccl) gpus_ = "gpu";
        const Result gpu = Train(Config(2, stage, offload), true, 2, 2,
                                 cpu_root + "/step_00000002");
        EXPECT_EQ(gpu.params, straight.params);
        const std::string gpu_root = dir + "/gpu" + std::to_string(stage) +
                                     std::to_string(static_cast<int>(offload)) +
                                     (nccl ? "n" : "");
        Train(two_steps(stage, offload), true, 2, 0, "", gpu_root);
        gpus_.reset();
        const Result cpu =
            Train(Config(2, stage), false, 2, 2, gpu_root + "/step_00000002");
        EXPECT_EQ(cpu.params, straight.params);
      }
    }
  }
  std::filesystem::remove_all(dir);
}

// A collective failing inside a layer hook (a peer's connection lost
// during stage 3's first gather) stops the pass on every rank with the
// collective's own error, not a device's.
TEST_F(GpuEngineHostTest, AHookFailureStopsThePassWithItsReason) {
  LocalWorld w(2, std::chrono::seconds(10));
  w.FailAt(1, 1);
  std::vector<Status> st = RunRanks(w, [&](Comm& comm) -> Status {
    EngineOptions o;
    o.device = DeviceKind::kCuda;
    ASSIGN_OR_RETURN(auto e,
                     MakeGpuEngine(Config(2, 3), &comm, o, CpuStandIn::Open));
    RETURN_IF_ERROR(e->ZeroGrad());
    return e->TrainMicroBatch(MakeBatch(comm.rank(), 0, 0), 1.0f).status();
  });
  for (int r = 0; r < 2; ++r) {
    ASSERT_FALSE(st[r].ok()) << r;
    EXPECT_EQ(st[r].code(), StatusCode::kUnavailable) << st[r].ToString();
    EXPECT_EQ(st[r].message().find("GPU:"), std::string::npos)
        << st[r].ToString();
  }
}

// Every stage, offloaded or not, with a GPU per rank reduces and gathers
// on the GPUs (NCCL's part, here the stand-in's over the host Comm;
// under stages 2 and 3 a layer at a time from the hooks): the CPU engine's
// bits, the collectives run by the device, and the summary line says so.
// Ranks sharing a GPU, DSL_NCCL=0, NCCL missing on one rank, no id on rank
// 0 or one rank unable to join: every rank takes the host's Gloo path
// together, with the same bits and the reason said.
TEST_F(GpuEngineHostTest, CollectivesRunOnTheGpusWhenEachRankHasOne) {
  enum Trouble { kNone, kOff, kNoNcclOnRank1, kNoId, kRank1CannotJoin };
  struct Case {
    std::string gpus;  // "" : one GPU the ranks share
    Trouble trouble;
    bool on_gpus;
    const char* says;  // in rank 0's summary
  };
  for (int stage : {0, 1, 2, 3}) {
    const Result cpu = Train(Config(2, stage), false, 2);
    for (Offload offload : Offloads(stage)) {
      for (const Case& c : std::vector<Case>{
               {"gpu", kNone, true, "collectives NCCL"},
               {"", kNone, false,
                "Gloo through host memory (ranks share a GPU)"},
               {"gpu", kOff, false, "Gloo through host memory (DSL_NCCL=0)"},
               {"gpu", kNoNcclOnRank1, false,
                "(NCCL is off or missing on another rank)"},
               {"gpu", kNoId, false,
                "(rank 0 could not make an NCCL id: no id in this stand-in)"},
               {"gpu", kRank1CannotJoin, false,
                "(NCCL's communicator failed on another rank)"}}) {
        SCOPED_TRACE("stage " + std::to_string(stage) + Name(offload) + ", " +
                     c.says);
        if (c.trouble == kOff) ::setenv("DSL_NCCL", "0", 1);
        CpuStandIn::no_nccl_rank = c.trouble == kNoNcclOnRank1 ? 1 : -1;
        CpuStandIn::no_id = c.trouble == kNoId;
        CpuStandIn::bad_join_rank = c.trouble == kRank1CannotJoin ? 1 : -1;
        gpus_ = c.gpus;
        CpuStandIn::collectives = 0;
        const Result gpu = Train(Config(2, stage, offload), true, 2);
        gpus_.reset();
        ::unsetenv("DSL_NCCL");
        CpuStandIn::no_nccl_rank = -1;
        CpuStandIn::no_id = false;
        CpuStandIn::bad_join_rank = -1;
        EXPECT_EQ(gpu.norms, cpu.norms);
        EXPECT_EQ(gpu.params, cpu.params);
        EXPECT_EQ(gpu.eval, cpu.eval);
        EXPECT_EQ(gpu.ck_m, cpu.ck_m);
        EXPECT_EQ(gpu.ck_v, cpu.ck_v);
        EXPECT_EQ(CpuStandIn::collectives.load() > 0, c.on_gpus);
        EXPECT_NE(gpu.describe.find(c.says), std::string::npos) << gpu.describe;
      }
    }
  }
}

// The engine options MakeGpuEngine builds pass CheckDeviceOptions in every
// stage (the stand-in, like the CUDA engine, refuses those that do not),
// and the check finds what a broken host side would send: a segment past
// its buffer, a tensor outside its layer's window (llm.c's order under
// windows), windows without hooks or bounds.
TEST(DeviceOptions, TheCheckRefusesWhatWouldReachPastABuffer) {
  DeviceEngineOptions seen;
  auto capture = [&seen](const DeviceEngineOptions& o)
      -> StatusOr<std::unique_ptr<DeviceEngine>> {
    seen = o;
    return CpuStandIn::Open(o);
  };
  LocalWorld w(1, std::chrono::seconds(10));
  std::unique_ptr<Comm> comm = w.MakeComm(0);
  EngineOptions eo;
  eo.device = DeviceKind::kCuda;
  const std::string base =
      R"({"train_micro_batch_size_per_gpu": 2,
          "model": {"n_layer": 2, "n_head": 2, "n_embd": 16, "seq_len": 8,
                    "vocab_size": 67},
          "data": {"train": "unused.bin"}, "zero_optimization": {"stage": )";
  std::vector<DeviceEngineOptions> good;
  for (int stage : {0, 1, 2, 3}) {
    auto c = ParseTrainConfig(base + std::to_string(stage) + "}}", "t.json", 1);
    ASSERT_TRUE(c.ok()) << c.status().ToString();
    auto e = MakeGpuEngine(*c, comm.get(), eo, capture);
    ASSERT_TRUE(e.ok()) << stage << ": " << e.status().ToString();
    EXPECT_EQ(CheckDeviceOptions(seen), "") << stage;
    good.push_back(seen);
  }
  // Stage 0's options (llm.c's order, whole buffers); stage 3's (windows).
  DeviceEngineOptions o = good[0];
  o.adam.back().count += 1;
  EXPECT_EQ(CheckDeviceOptions(o), "an optimizer segment past its buffers");
  o = good[0];
  o.model.offset[2] = o.model.num_params - 1;  // ln1w
  EXPECT_EQ(CheckDeviceOptions(o), "a parameter tensor past the buffer");
  o = good[3];
  o.hooks = nullptr;
  EXPECT_EQ(CheckDeviceOptions(o), "layer windows without hooks");
  o = good[3];
  o.model.layer_begin.pop_back();
  EXPECT_EQ(CheckDeviceOptions(o), "layer windows without the layer bounds");
  o = good[3];
  std::swap(o.model.layer_begin[1], o.model.layer_begin[2]);
  EXPECT_EQ(CheckDeviceOptions(o), "layer bounds out of order");
  o = good[0];  // llm.c's order under stage 3's windows
  o.windows = good[3].windows;
  o.hooks = good[3].hooks;
  o.model.layer_begin = good[3].model.layer_begin;
  o.adam.clear();
  EXPECT_EQ(CheckDeviceOptions(o),
            "a parameter tensor outside its layer's window");
  o = good[3];
  o.owned_count -= 1;
  EXPECT_EQ(CheckDeviceOptions(o), "an optimizer segment past its buffers");
  o = good[0];
  o.model.num_layers = 0;
  EXPECT_EQ(CheckDeviceOptions(o), "an empty model spec");
}

}  // namespace
}  // namespace dslaunch::worker
