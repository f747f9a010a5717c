// The GPU engines' host side (worker/gpu/: ZeRO stages 0-3, the
// optimizer on the device or offloaded, the parameters offloaded under
// stage 3, layer windows and hooks, checkpoints, resume) on machines without
// a GPU: the DeviceEngine is a stand-in (cpu_stand_in.h) that computes on the
// CPU with the CPU engine's own Model and AdamW, so every result must equal the
// CPU engine's bit for bit. On a GPU, tests/cuda/trainer_test.cc runs the same
// configs on the CUDA engine against the CPU within stated tolerances.
#include <gtest/gtest.h>
#include <omp.h>     // omp_set_num_threads
#include <stdlib.h>  // mkdtemp

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "tests/worker/cpu_stand_in.h"
#include "worker/checkpoint.h"
#include "worker/comm_local.h"
#include "worker/device_engine.h"
#include "worker/engine.h"
#include "worker/model.h"
#include "worker/partition.h"
#include "worker/train_config.h"

namespace dslaunch::worker {
namespace {

// What a config offloads to the CPU.
enum Offload { kNothing, kOptimizer, kParams };
const char* Name(Offload o) {
  return o == kNothing     ? ""
         : o == kOptimizer ? ", optimizer offloaded"
                           : ", parameters offloaded";
}

// The offload modes a stage takes: offload_param only under stage 3.
std::vector<Offload> Offloads(int stage) {
  if (stage == 3) return {kNothing, kOptimizer, kParams};
  return {kNothing, kOptimizer};
}

class GpuEngineHostTest : public ::testing::Test {
 protected:
  // 2 layers, 2 heads, C 16, T 8, V 67; micro batch 2; clipping on; a
  // reduce bucket of about one block, so that stages 2 and 3 reduce in
  // several buckets.
  TrainConfig Config(int world, int stage, Offload offload = kNothing) {
    const std::string text =
        R"({"train_micro_batch_size_per_gpu": 2,
            "gradient_accumulation_steps": 2, "gradient_clipping": 0.5,
            "optimizer": {"type": "AdamW",
                          "params": {"lr": 0.01, "weight_decay": 0.1}},
            "zero_optimization": {"stage": )" +
        std::to_string(stage) + R"(, "reduce_bucket_size": 4000)" +
        (offload == kOptimizer ? R"(, "offload_optimizer": {"device": "cpu"})"
         : offload == kParams  ? R"(, "offload_param": {"device": "cpu"})"
                               : "") +
        R"(}, "model": {"n_layer": 2, "n_head": 2, "n_embd": 16,
                      "seq_len": 8, "vocab_size": 67},
            "data": {"train": "unused.bin"},
            "train": {"steps": 4, "seed": 7}})";
    auto c = ParseTrainConfig(text, "test.json", world);
    EXPECT_TRUE(c.ok()) << c.status().ToString();
    return c.ok() ? *c : TrainConfig{};
  }

  // Micro-batch `micro` of `step` for `rank`: tokens from a generator.
  static Batch MakeBatch(int rank, int step, int micro) {
    Batch b;
    b.batch_size = 2;
    b.seq_len = 8;
    uint32_t x = 1000u * static_cast<uint32_t>(rank + 1) +
                 17u * static_cast<uint32_t>(step) +
                 static_cast<uint32_t>(micro);
    for (int i = 0; i < b.batch_size * b.seq_len; ++i) {
      x = x * 1103515245u + 12345u;
      b.inputs.push_back(static_cast<int32_t>((x >> 16) % 67));
      x = x * 1103515245u + 12345u;
      b.targets.push_back(static_cast<int32_t>((x >> 16) % 67));
    }
    return b;
  }

  // What Trainer::Step does, for steps [from, to): accumulation, the
  // gradients finished, clipping, AdamW.
  static Status Steps(Engine& e, const TrainConfig& c, Comm& comm, int from,
                      int to, std::vector<float>* norms) {
    const int gas = c.batch.gradient_accumulation_steps;
    for (int step = from; step < to; ++step) {
      RETURN_IF_ERROR(e.ZeroGrad());
      for (int micro = 0; micro < gas; ++micro) {
        ASSIGN_OR_RETURN(float loss,
                         e.TrainMicroBatch(MakeBatch(comm.rank(), step, micro),
                                           1.0f / static_cast<float>(gas)));
        (void)loss;
      }
      ASSIGN_OR_RETURN(float norm, e.FinishGradients());
      norms->push_back(norm);
      const float clip = norm > 0.5f ? 0.5f / (norm + 1e-6f) : 1.0f;
      AdamParams a;
      a.lr = 0.01;
      a.weight_decay = 0.1;
      a.step = step + 1;
      RETURN_IF_ERROR(e.Update(a, clip));
    }
    return Status::Ok();
  }

  struct Result {
    std::vector<float> params;     // whole, llm.c order
    std::vector<float> ck_params;  // each rank's checkpoint range, in order
    std::vector<float> ck_m, ck_v;
    std::vector<float> norms;  // rank 0's
    int64_t state_bytes = 0;   // rank 0's
    int64_t device_bytes = 0;  // rank 0's
    std::string describe;      // rank 0's
    float eval = 0;            // rank 0's loss on a batch after training
  };

  // With a value, the stand-ins have collectives (CpuStandIn::
  // WithCollectives) and their GPUs are named so.
  std::optional<std::string> gpus_;

  // `steps` steps on `world` ranks, on the CPU engine or the GPU engine
  // over the stand-in; resumed from `resume` (a checkpoint directory) at
  // step `first` when given; a checkpoint of the end saved under `save`.
  Result Train(const TrainConfig& c, bool gpu, int world, int first = 0,
               const std::string& resume = "", const std::string& save = "") {
    LocalWorld w(world, std::chrono::seconds(30));
    Result out;
    std::vector<std::vector<float>> ck(3 * world);
    std::vector<Status> st = RunRanks(w, [&](Comm& comm) -> Status {
      omp_set_num_threads(1);
      EngineOptions o;
      std::unique_ptr<Engine> e;
      if (gpu) {
        o.device = DeviceKind::kCuda;
        ASSIGN_OR_RETURN(
            e, MakeGpuEngine(c, &comm, o,
                             gpus_ ? CpuStandIn::WithCollectives(&comm, *gpus_)
                                   : DeviceOpener(CpuStandIn::Open)));
      } else {
        ASSIGN_OR_RETURN(e, MakeEngine(c, &comm, o));
      }
      if (!resume.empty()) RETURN_IF_ERROR(e->Resume(resume));
      std::vector<float> norms;
      RETURN_IF_ERROR(Steps(*e, c, comm, first, c.train.steps, &norms));
      ASSIGN_OR_RETURN(float eval, e->EvalBatch(MakeBatch(comm.rank(), 99, 0)));
      const Partition part = MakePartition(e->num_params(), comm.size());
      const int r = comm.rank();
      ASSIGN_OR_RETURN(RankShard shard,
                       e->CheckpointRange(part.begin(r), part.real(r)));
      ck[3 * r].assign(shard.params.begin(), shard.params.end());
      ck[3 * r + 1].assign(shard.m.begin(), shard.m.end());
      ck[3 * r + 2].assign(shard.v.begin(), shard.v.end());
      if (!save.empty()) {
        CheckpointState state;
        state.step = c.train.steps;
        state.num_params = e->num_params();
        state.model = e->model_config();
        ASSIGN_OR_RETURN(std::string dir,
                         SaveCheckpoint(save, state, shard, 0, comm));
        (void)dir;
      }
      ASSIGN_OR_RETURN(std::vector<float> params, e->WholeParams());
      if (r == 0) {
        out.params = params;
        out.norms = norms;
        out.state_bytes = e->state_bytes();
        out.device_bytes = e->device_memory_bytes();
        out.describe = e->Describe();
        out.eval = eval;
      }
      return Status::Ok();
    });
    for (size_t r = 0; r < st.size(); ++r)
      EXPECT_TRUE(st[r].ok()) << "rank " << r << ": " << st[r].ToString();
    for (int r = 0; r < world; ++r) {
      out.ck_params.insert(out.ck_params.end(), ck[3 * r].begin(),
                           ck[3 * r].end());
      out.ck_m.insert(out.ck_m.end(), ck[3 * r + 1].begin(),
                      ck[3 * r + 1].end());
      out.ck_v.insert(out.ck_v.end(), ck[3 * r + 2].begin(),
                      ck[3 * r + 2].end());
    }
    return out;
  }
};

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

// The offloaded optimizer sends the parameters back to the device piece by
// piece as the host's AdamW (and under stage 2 the layer's gather) finishes
// each, with several copies running before the one wait of the step, where
// the whole comes back at once (stages 0, 1 and 2 at one rank, stages 0
// and 2 at two, stage 1 at two with NCCL's gather on the GPUs; stage 1 at
// two over Gloo gathers on the host first, and stage 3's next pass gathers
// its parameters; stages 2 and 3 at two with NCCL copy each owned piece as
// it is done, the GPUs then gathering them). The results are the CPU engine's
// (above); the stand-in fails a host that writes into a range being copied or a
// pass that starts before the wait.
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
