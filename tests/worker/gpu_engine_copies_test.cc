// What the GPU engines move between host and device (worker/gpu/), counted
// through the CPU stand-in (cpu_stand_in.h): the offloaded optimizer's
// parameters copied piece by piece while the host updates, exactly the
// floats each stage needs to move a step, and the device memory each stage
// holds. The results are the CPU engine's bit for bit
// (gpu_engine_host_test.cc).
#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "tests/worker/cpu_stand_in.h"
#include "tests/worker/gpu_engine_host_fixture.h"
#include "worker/comm_local.h"
#include "worker/device_engine.h"
#include "worker/engine.h"
#include "worker/param_layout.h"
#include "worker/partition.h"

namespace dslaunch::worker {
namespace {

// The offloaded optimizer sends the parameters back to the device piece by
// piece as the host's AdamW (and under stage 2 the layer's gather) finishes
// each, with several copies running before the one wait of the step, where
// the whole comes back at once (stages 0, 1 and 2 at one rank, stages 0
// and 2 at two, stage 1 at two with NCCL's gather on the GPUs; stage 1 at
// two over Gloo gathers on the host first, and stage 3's next pass gathers
// its parameters; stages 2 and 3 at two with NCCL copy each owned piece as
// it is done, the GPUs then gathering them). The results are the CPU
// engine's (gpu_engine_host_test.cc); the stand-in fails a host that writes
// into a range being copied or a pass that starts before the wait.
TEST_F(GpuEngineHostTest, OffloadedStepsCopyParametersWhileTheHostUpdates) {
  struct Case {
    int world, stage;
    bool nccl, pieces;
  };
  for (const Case& c : std::vector<Case>{{1, 0, false, true},
                                         {1, 1, false, true},
                                         {1, 2, false, true},
                                         {2, 0, false, true},
                                         {2, 2, false, true},
                                         {2, 1, true, true},
                                         {2, 2, true, true},
                                         {2, 3, true, true},
                                         {2, 1, false, false},
                                         {2, 3, false, false}}) {
    SCOPED_TRACE("world " + std::to_string(c.world) + ", stage " +
                 std::to_string(c.stage) + (c.nccl ? ", NCCL" : ""));
    if (c.nccl) gpus_ = "gpu";
    CpuStandIn::param_copies = 0;
    CpuStandIn::most_param_copies = 0;
    const Result gpu =
        Train(Config(c.world, c.stage, kOptimizer), true, c.world);
    gpus_.reset();
    ASSERT_EQ(gpu.norms.size(), 4u);
    if (c.pieces) {
      // Every rank, 4 steps, more than one piece a step.
      EXPECT_GT(CpuStandIn::param_copies, 4 * c.world);
      EXPECT_GT(CpuStandIn::most_param_copies, 1);
    } else {
      EXPECT_EQ(CpuStandIn::param_copies, 0);
    }
  }
  // The stand-in's own checks: a range written while its copy runs, a pass
  // with a copy unwaited, and a wait for nothing.
  DeviceEngine* dev = nullptr;
  auto capture = [&dev](const DeviceEngineOptions& o)
      -> StatusOr<std::unique_ptr<DeviceEngine>> {
    ASSIGN_OR_RETURN(std::unique_ptr<DeviceEngine> e, CpuStandIn::Open(o));
    dev = e.get();
    return e;
  };
  LocalWorld w(1, std::chrono::seconds(10));
  std::unique_ptr<Comm> comm = w.MakeComm(0);
  EngineOptions eo;
  eo.device = DeviceKind::kCuda;
  auto e = MakeGpuEngine(Config(1, 0, kOptimizer), comm.get(), eo, capture);
  ASSERT_TRUE(e.ok()) << e.status().ToString();
  std::vector<float> host(8, 1.0f);
  ASSERT_TRUE(dev->StartSetParams(0, host.size(), host.data()));
  host[3] = 2.0f;
  EXPECT_FALSE(dev->WaitSetParams());
  EXPECT_EQ(dev->error(), "the host changed parameters while their copy ran");
  ASSERT_TRUE(dev->StartSetParams(0, host.size(), host.data()));
  const Batch b = MakeBatch(0, 0, 0);
  float loss = 0;
  EXPECT_FALSE(dev->TrainMicroBatch(b.inputs.data(), b.targets.data(), 2, 8,
                                    1.0f, &loss));
  EXPECT_EQ(dev->error(),
            "parameters used with their copy to the device unwaited");
  EXPECT_TRUE(dev->WaitSetParams());
  EXPECT_FALSE(dev->WaitSetParams());
  EXPECT_EQ(dev->error(), "a wait for no parameter copy");
  CpuStandIn::unpinned_copies = 0;  // `host` was not pinned
}

// Stage 1 over Gloo with the optimizer on the device moves only what each
// rank needs a step: the whole gradients down (to reduce-scatter), its
// shard's reduced gradients up, its shard's updated parameters down and
// every other rank's up: 2 n_p + real floats a rank (n_p the padded
// buffer, real its shard's real part), 2 N n_p + n for N ranks, where
// whole buffers each way would be 4 N n_p. Stage 0: the whole gradients
// down and up, 2 N n (the parameters stay). Counted as the floats the
// stand-in copies in 2 steps less those in 1, at 3 ranks (whose shards
// are padded: n is not a multiple of 3) and 2.
TEST_F(GpuEngineHostTest, StagesZeroAndOneMoveOnlyWhatEachRankNeeds) {
  const auto n = static_cast<int64_t>(
      ParamLayout(ModelConfig::Make(8, 67, 2, 2, 16)).num_params());
  ASSERT_NE(n % 3, 0);
  for (int world : {3, 2}) {
    const auto padded =
        world * static_cast<int64_t>(MakePartition(n, world).shard);
    for (int stage : {0, 1}) {
      SCOPED_TRACE("world " + std::to_string(world) + ", stage " +
                   std::to_string(stage));
      std::vector<int64_t> copied;
      for (int steps : {1, 2}) {
        TrainConfig c = Config(world, stage);
        c.train.steps = steps;
        CpuStandIn::copied_floats = 0;
        const Result r = Train(c, true, world);
        ASSERT_EQ(r.norms.size(), static_cast<size_t>(steps));
        copied.push_back(CpuStandIn::copied_floats);
      }
      EXPECT_EQ(copied[1] - copied[0],
                stage == 0 ? 2 * world * padded : 2 * world * padded + n);
    }
  }
}

// Offloaded with a GPU per rank, each rank's reduced gradients come down
// and its updated parameters go up, and no more: stage 0 all of them (2 n
// floats a rank and step), stage 1 its shard's real part (2 n over the
// ranks), stage 2 its owned pieces (o padded floats down, their real part
// up: N o + n over the ranks), stage 3 its owned pieces both ways (2 N o).
// Over Gloo every rank's whole gradients come down to be reduced on the
// host. Counted as in the test above, at 3 ranks and 2.
TEST_F(GpuEngineHostTest, OffloadedWithNcclMoveOnlyEachRanksPieces) {
  const ModelConfig mc = ModelConfig::Make(8, 67, 2, 2, 16);
  const auto n = static_cast<int64_t>(ParamLayout(mc).num_params());
  const ParamLayout layer_major(mc, ParamOrder::kLayerMajor);
  for (int world : {3, 2}) {
    int64_t owned = 0;  // a rank's, padded
    for (int l = -1; l <= 2; ++l) {
      owned += static_cast<int64_t>(
          MakePartition(layer_major.LayerRanges(l).at(0).size(), world).shard);
    }
    const int64_t expected[4] = {2 * world * n, 2 * n, world * owned + n,
                                 2 * world * owned};
    for (int stage : {0, 1, 2, 3}) {
      SCOPED_TRACE("world " + std::to_string(world) + ", stage " +
                   std::to_string(stage));
      std::vector<int64_t> copied;
      for (int steps : {1, 2}) {
        TrainConfig c = Config(world, stage, kOptimizer);
        c.train.steps = steps;
        gpus_ = "gpu";
        CpuStandIn::copied_floats = 0;
        CpuStandIn::collectives = 0;
        const Result r = Train(c, true, world);
        gpus_.reset();
        ASSERT_EQ(r.norms.size(), static_cast<size_t>(steps));
        ASSERT_GT(CpuStandIn::collectives, 0);
        copied.push_back(CpuStandIn::copied_floats);
      }
      EXPECT_EQ(copied[1] - copied[0], expected[stage]);
    }
  }
}

// What the device holds (the stand-in's peak is its buffers) per stage on
// 2 ranks, n parameters: stage 0 parameters, gradients and both moments of
// all of them (16n); stage 1 the moments of its shard only; stage 2 whole
// parameters and the owned pieces' gradients and moments (4n + 12o, o the
// owned floats: every layer's shard); stage 3 only owned pieces (16o).
// Offloaded, the moments (and owned gradients, and under stage 3 the owned
// parameters) are the host's instead; with NCCL the device keeps the owned
// gradients (and under stage 3 the owned parameters) for its collectives.
TEST_F(GpuEngineHostTest, DeviceStateFollowsTheZeroLaw) {
  const auto n = static_cast<int64_t>(
      ParamLayout(ModelConfig::Make(8, 67, 2, 2, 16)).num_params());
  const auto shard = static_cast<int64_t>(MakePartition(n, 2).shard);
  const ParamLayout layer_major(ModelConfig::Make(8, 67, 2, 2, 16),
                                ParamOrder::kLayerMajor);
  int64_t owned = 0;
  for (int l = -1; l <= 2; ++l) {
    owned += static_cast<int64_t>(
        MakePartition(layer_major.LayerRanges(l).at(0).size(), 2).shard);
  }
  ASSERT_LT(owned, n);  // the test model splits into real halves
  struct Case {
    int stage;
    Offload offload;
    int64_t device;
    bool nccl = false;
  };
  for (const Case& c :
       std::vector<Case>{{0, kNothing, 16 * n},
                         {0, kOptimizer, 8 * n},
                         {1, kNothing, 8 * n + 8 * shard},
                         {1, kOptimizer, 8 * n},
                         {2, kNothing, 4 * n + 12 * owned},
                         {2, kOptimizer, 4 * n},
                         {3, kNothing, 16 * owned},
                         {3, kOptimizer, 0},
                         {3, kParams, 0},
                         {2, kNothing, 4 * n + 12 * owned, true},
                         {2, kOptimizer, 4 * n + 4 * owned, true},
                         {3, kOptimizer, 8 * owned, true},
                         {3, kParams, 8 * owned, true}}) {
    SCOPED_TRACE("stage " + std::to_string(c.stage) + Name(c.offload) +
                 (c.nccl ? ", NCCL" : ""));
    TrainConfig config = Config(2, c.stage, c.offload);
    config.train.steps = 1;
    if (c.nccl) gpus_ = "gpu";
    const Result r = Train(config, true, 2);
    gpus_.reset();
    EXPECT_EQ(r.device_bytes, c.device);
  }
}

}  // namespace
}  // namespace dslaunch::worker
