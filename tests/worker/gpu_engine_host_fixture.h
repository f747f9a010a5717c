// What the GPU engines' host-side tests share (gpu_engine_host_test.cc,
// gpu_engine_copies_test.cc): a small GPT-2 config for any stage and
// offload, the trainer's step loop, and a run on the CPU engine or on the
// GPU engine over the CPU stand-in (cpu_stand_in.h), whose results must
// then be the CPU engine's bit for bit.
#pragma once

#include <gtest/gtest.h>
#include <omp.h>  // omp_set_num_threads

#include <chrono>
#include <cstdint>
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

// What a config offloads to the CPU.
enum Offload { kNothing, kOptimizer, kParams };
inline const char* Name(Offload o) {
  return o == kNothing     ? ""
         : o == kOptimizer ? ", optimizer offloaded"
                           : ", parameters offloaded";
}

// The offload modes a stage takes: offload_param only under stage 3.
inline std::vector<Offload> Offloads(int stage) {
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

}  // namespace dslaunch::worker
