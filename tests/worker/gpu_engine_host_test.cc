// The GPU engine's host side (engine_gpu.cc: ZeRO stages 0-2, the optimizer
// on the device or offloaded, checkpoints, resume) on machines without a
// GPU: its DeviceEngine is a stand-in that computes on the CPU with the CPU
// engine's own Model and AdamW, so every result must equal the CPU engine's
// bit for bit. On a GPU, tests/cuda/trainer_test.cc runs the same configs on
// the CUDA engine against the CPU within stated tolerances.
#include <gtest/gtest.h>
#include <omp.h>     // omp_set_num_threads
#include <stdlib.h>  // mkdtemp

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "worker/checkpoint.h"
#include "worker/comm_local.h"
#include "worker/cpu_adam.h"
#include "worker/device_engine.h"
#include "worker/engine.h"
#include "worker/model.h"
#include "worker/partition.h"
#include "worker/train_config.h"

namespace dslaunch::worker {
namespace {

// A DeviceEngine whose "device" is host memory: the CPU Model (llm.c's
// order, as the CUDA engine keeps it) and the CPU's AdamW over the part of
// the buffer the options give it moments for.
class CpuStandIn final : public DeviceEngine {
 public:
  static StatusOr<std::unique_ptr<DeviceEngine>> Open(
      const DeviceEngineOptions& o) {
    const DeviceModelSpec& s = o.model;
    ASSIGN_OR_RETURN(std::unique_ptr<Model> model,
                     Model::Create(ModelConfig::Make(s.max_seq_len,
                                                     s.vocab_size, s.num_layers,
                                                     s.num_heads, s.channels)));
    if (model->layout().num_params() != s.num_params)
      return Internal("the spec's num_params differs from the model's");
    auto e = std::unique_ptr<CpuStandIn>(new CpuStandIn(o, std::move(model)));
    return std::unique_ptr<DeviceEngine>(std::move(e));
  }

  std::string Describe() const override { return "a CPU stand-in"; }
  const std::string& error() const override { return error_; }

  bool SetParams(const float* host) override { return Copy(host, P(), n_); }
  bool GetParams(float* host) override { return Copy(P(), host, n_); }
  bool SetGrads(const float* host) override { return Copy(host, G(), n_); }
  bool GetGrads(float* host) override { return Copy(G(), host, n_); }
  bool SetMoments(const float* m, const float* v) override {
    return Copy(m, m_.data(), m_.size()) && Copy(v, v_.data(), v_.size());
  }
  bool GetMoments(float* m, float* v) override {
    return Copy(m_.data(), m, m_.size()) && Copy(v_.data(), v, v_.size());
  }
  bool ZeroGrad() override {
    model_->ZeroGrad();
    return true;
  }
  bool TrainMicroBatch(const int* tokens, const int* targets, int B, int T,
                       float grad_scale, float* loss) override {
    *loss = model_->Forward(tokens, targets, B, T);
    model_->Backward(grad_scale);
    return true;
  }
  bool EvalBatch(const int* tokens, const int* targets, int B, int T,
                 float* loss) override {
    *loss = model_->Forward(tokens, targets, B, T);
    return true;
  }
  bool GradSquaredSum(double* out) override {
    double sum = 0;
    for (size_t i = 0; i < n_; ++i) sum += static_cast<double>(G()[i]) * G()[i];
    *out = sum;
    return true;
  }
  bool AdamStep(const DeviceAdam& a, float grad_scale) override {
    if (m_.empty()) return true;  // as the CUDA engine: nothing is ours
    const AdamParams p{a.lr,           a.beta1,      a.beta2, a.eps,
                       a.weight_decay, a.adamw_mode, a.step};
    const size_t lo = begin_, hi = begin_ + m_.size();
    for (size_t i = lo; i < hi && grad_scale != 1.0f; ++i) G()[i] *= grad_scale;
    for (const DeviceModelSpec::Segment& s : segments_) {
      const size_t b = std::max(lo, s.begin), e = std::min(hi, s.end);
      if (b >= e) continue;
      worker::AdamStep(P() + b, G() + b, m_.data() + (b - lo),
                       v_.data() + (b - lo), e - b, p, s.decay);
    }
    return true;
  }
  int64_t peak_memory_bytes() const override { return state_bytes(); }
  int64_t state_bytes() const override {
    return 8 * static_cast<int64_t>(n_ + m_.size());
  }

 private:
  CpuStandIn(const DeviceEngineOptions& o, std::unique_ptr<Model> model)
      : model_(std::move(model)),
        n_(o.model.num_params),
        segments_(o.model.segments) {
    begin_ = std::min(o.moments_begin, n_);
    const size_t count = std::min(o.moments_count, n_ - begin_);
    m_.assign(count, 0.0f);
    v_.assign(count, 0.0f);
  }
  float* P() { return model_->params().data(); }
  float* G() { return model_->grads().data(); }
  static bool Copy(const float* from, float* to, size_t n) {
    std::copy(from, from + n, to);
    return true;
  }

  std::unique_ptr<Model> model_;
  size_t n_;
  std::vector<DeviceModelSpec::Segment> segments_;
  size_t begin_ = 0;
  std::vector<float> m_, v_;
  std::string error_;
};

class GpuEngineHostTest : public ::testing::Test {
 protected:
  // 2 layers, 2 heads, C 16, T 8, V 67; micro batch 2; clipping on.
  TrainConfig Config(int world, int stage, bool offload) {
    const std::string text =
        R"({"train_micro_batch_size_per_gpu": 2,
            "gradient_accumulation_steps": 2, "gradient_clipping": 0.5,
            "optimizer": {"type": "AdamW",
                          "params": {"lr": 0.01, "weight_decay": 0.1}},
            "zero_optimization": {"stage": )" +
        std::to_string(stage) +
        (offload ? R"(, "offload_optimizer": {"device": "cpu"})" : "") +
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
  };

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
        ASSIGN_OR_RETURN(e, MakeGpuEngine(c, &comm, o, CpuStandIn::Open));
      } else {
        ASSIGN_OR_RETURN(e, MakeEngine(c, &comm, o));
      }
      if (!resume.empty()) RETURN_IF_ERROR(e->Resume(resume));
      std::vector<float> norms;
      RETURN_IF_ERROR(Steps(*e, c, comm, first, c.train.steps, &norms));
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

// The CPU engine whose bits the GPU engine's host side must give: the
// replicated one at the same stage, stage 1 for stage 2 (the GPU keeps
// stage 1's law there; the gradient norm, summed per shard, differs from
// stage 0's in the last bits, and with clipping so do the parameters).
int ReferenceStage(int stage) { return std::min(stage, 1); }

TEST_F(GpuEngineHostTest, EveryStageAndOffloadEqualTheCpuEngineBitForBit) {
  for (int world : {1, 2}) {
    for (int stage : {0, 1, 2}) {
      const Result cpu =
          Train(Config(world, ReferenceStage(stage), false), false, world);
      ASSERT_EQ(cpu.norms.size(), 4u);
      for (bool offload : {false, true}) {
        SCOPED_TRACE("world " + std::to_string(world) + ", stage " +
                     std::to_string(stage) + (offload ? ", offloaded" : ""));
        const Result gpu = Train(Config(world, stage, offload), true, world);
        EXPECT_EQ(gpu.norms, cpu.norms);
        EXPECT_EQ(gpu.params, cpu.params);
        EXPECT_EQ(gpu.ck_params, cpu.ck_params);
        EXPECT_EQ(gpu.ck_m, cpu.ck_m);
        EXPECT_EQ(gpu.ck_v, cpu.ck_v);
      }
    }
  }
}

// The device holds parameters and gradients (8 bytes a parameter) and the
// moments of its part (8 bytes a parameter of it): all under stage 0, its
// shard under stages 1 and 2, none offloaded, where the host holds them.
TEST_F(GpuEngineHostTest, StateBytesFollowTheZeroLaw) {
  LocalWorld w(2, std::chrono::seconds(30));
  std::vector<int64_t> bytes(8);
  std::vector<Status> st = RunRanks(w, [&](Comm& comm) -> Status {
    int i = 0;
    for (int stage : {0, 1, 2}) {
      for (bool offload : {false, true}) {
        EngineOptions o;
        o.device = DeviceKind::kCuda;
        ASSIGN_OR_RETURN(auto e, MakeGpuEngine(Config(2, stage, offload), &comm,
                                               o, CpuStandIn::Open));
        if (comm.rank() == 0) bytes[i] = e->state_bytes();
        ++i;
      }
    }
    return Status::Ok();
  });
  ASSERT_TRUE(st[0].ok()) << st[0].ToString();
  ASSERT_TRUE(st[1].ok()) << st[1].ToString();
  const auto n = static_cast<int64_t>(
      ParamLayout(ModelConfig::Make(8, 67, 2, 2, 16)).num_params());
  const auto shard = static_cast<int64_t>(MakePartition(n, 2).shard);
  EXPECT_EQ(bytes[0], 16 * n);             // stage 0
  EXPECT_EQ(bytes[1], 16 * n);             // stage 0, the moments offloaded
  EXPECT_EQ(bytes[2], 8 * n + 8 * shard);  // stage 1
  EXPECT_EQ(bytes[3], 8 * n + 8 * shard);  // the shard's moments offloaded
  EXPECT_EQ(bytes[4], 8 * n + 8 * shard);  // stage 2 keeps stage 1's law
  EXPECT_EQ(bytes[5], 8 * n + 8 * shard);
}

// A checkpoint of the CPU engine after 2 steps resumes on the GPU engine in
// every mode, and 2 more steps there equal 4 on the CPU; a checkpoint the
// GPU engine writes after 2 steps resumes on the CPU engine the same way.
TEST_F(GpuEngineHostTest, CheckpointsMoveBetweenTheEngines) {
  std::string dir = ::testing::TempDir() + "dsl_gpu_host_XXXXXX";
  ASSERT_NE(::mkdtemp(dir.data()), nullptr);
  auto two_steps = [this](int stage, bool offload) {
    TrainConfig c = Config(2, stage, offload);
    c.train.steps = 2;
    return c;
  };
  for (int stage : {0, 1, 2}) {
    const int ref = ReferenceStage(stage);
    const Result straight = Train(Config(2, ref, false), false, 2);
    const std::string cpu_root = dir + "/cpu" + std::to_string(stage);
    Train(two_steps(ref, false), false, 2, 0, "", cpu_root);
    for (bool offload : {false, true}) {
      SCOPED_TRACE("stage " + std::to_string(stage) +
                   (offload ? ", offloaded" : ""));
      const Result gpu = Train(Config(2, stage, offload), true, 2, 2,
                               cpu_root + "/step_00000002");
      EXPECT_EQ(gpu.params, straight.params);
      const std::string gpu_root =
          dir + "/gpu" + std::to_string(stage) + (offload ? "o" : "");
      Train(two_steps(stage, offload), true, 2, 0, "", gpu_root);
      const Result cpu = Train(Config(2, ref, false), false, 2, 2,
                               gpu_root + "/step_00000002");
      EXPECT_EQ(cpu.params, straight.params);
    }
  }
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace dslaunch::worker
