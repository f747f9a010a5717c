// The GPU engines' host side (engine_gpu.cc: ZeRO stages 0-3, the
// optimizer on the device or offloaded, the parameters offloaded under
// stage 3, layer windows and hooks, checkpoints, resume) on machines without
// a GPU: the DeviceEngine is a stand-in that computes on the CPU with the
// CPU engine's own Model and AdamW, so every result must equal the CPU
// engine's bit for bit. On a GPU, tests/cuda/trainer_test.cc runs the same
// configs on the CUDA engine against the CPU within stated tolerances.
#include <gtest/gtest.h>
#include <omp.h>     // omp_set_num_threads
#include <stdlib.h>  // mkdtemp

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <span>
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

// A DeviceEngine whose "device" is host memory: the CPU Model, in the
// spec's order, and the CPU's AdamW over the options' segments. Under
// windows (ZeRO 2 and 3) the Model reads and writes through this stand-in
// as its ParamSource, whose windows follow the CUDA engine's: one for the
// embedding, one every other layer takes in turn, gradients taken by the
// host from AfterBackward and zeroed.
class CpuStandIn final : public DeviceEngine, ParamSource {
 public:
  static StatusOr<std::unique_ptr<DeviceEngine>> Open(
      const DeviceEngineOptions& o) {
    return OpenWith(o, nullptr, "");
  }
  // An opener whose stand-ins have collectives over `comm` (NCCL's part),
  // their GPUs named `gpu` + the rank ("" for one GPU every rank shares).
  static DeviceOpener WithCollectives(Comm* comm, std::string gpu) {
    return [comm, gpu](const DeviceEngineOptions& o) {
      return OpenWith(o, comm, gpu);
    };
  }
  static StatusOr<std::unique_ptr<DeviceEngine>> OpenWith(
      const DeviceEngineOptions& o, Comm* comm, const std::string& gpu) {
    const DeviceModelSpec& s = o.model;
    const bool windows = o.windows != DeviceWindows::kNone;
    ASSIGN_OR_RETURN(
        std::unique_ptr<Model> model,
        Model::Create(ModelConfig::Make(s.max_seq_len, s.vocab_size,
                                        s.num_layers, s.num_heads, s.channels),
                      windows ? ParamOrder::kLayerMajor : ParamOrder::kLlmc));
    if (model->layout().num_params() != s.num_params)
      return Internal("the spec's num_params differs from the model's");
    for (int k = 0; k < kNumParamKinds; ++k) {
      const auto kind = static_cast<ParamKind>(k);
      for (int l = 0; l < (IsPerLayer(kind) ? s.num_layers : 1); ++l) {
        if (model->layout().Offset(kind, l) != s.offset[k] + l * s.stride[k])
          return Internal("the spec's offsets differ from the model's");
      }
    }
    // As the CUDA engine does, and the options must pass.
    if (std::string why = CheckDeviceOptions(o); !why.empty())
      return Internal("engine options: " + why);
    auto e = std::unique_ptr<CpuStandIn>(new CpuStandIn(o, std::move(model)));
    e->comm_ = comm;
    e->gpu_ = gpu.empty() || comm == nullptr
                  ? "shared"
                  : gpu + std::to_string(comm->rank());
    return std::unique_ptr<DeviceEngine>(std::move(e));
  }

  std::string Describe() const override { return "a CPU stand-in"; }
  const std::string& error() const override { return error_; }

  // Copies from and to host memory the engine did not pin, in every
  // stand-in of this process.
  static std::atomic<int64_t> unpinned_copies;

  bool SetParams(const float* host) override { return Copy(host, params_); }
  bool GetParams(float* host) override { return Copy(params_, host); }
  bool SetGrads(const float* host) override { return Copy(host, grads_); }
  bool GetGrads(float* host) override { return Copy(grads_, host); }
  bool SetMoments(const float* m, const float* v) override {
    return Copy(m, m_) && Copy(v, v_);
  }
  bool GetMoments(float* m, float* v) override {
    return Copy(m_, m) && Copy(v_, v);
  }
  bool SetLayerParams(int layer, const float* host) override {
    if (o_.windows != DeviceWindows::kParamsAndGrads) return false;
    Check(host, LayerSize(layer));
    std::copy(host, host + LayerSize(layer), Window(param_windows_, layer));
    return true;
  }
  bool TakeLayerGrads(int layer, float* host) override {
    if (o_.windows == DeviceWindows::kNone) return false;
    float* w = Window(grad_windows_, layer);
    Check(host, LayerSize(layer));
    std::copy(w, w + LayerSize(layer), host);
    std::fill(w, w + LayerSize(layer), 0.0f);
    return true;
  }
  bool ZeroGrad() override {
    std::fill(grads_.begin(), grads_.end(), 0.0f);
    return true;
  }
  bool TrainMicroBatch(const int* tokens, const int* targets, int B, int T,
                       float grad_scale, float* loss) override {
    hooks_ok_ = true;
    *loss = model_->Forward(tokens, targets, B, T);
    model_->Backward(grad_scale);
    return hooks_ok_;
  }
  bool EvalBatch(const int* tokens, const int* targets, int B, int T,
                 float* loss) override {
    hooks_ok_ = true;
    *loss = model_->Forward(tokens, targets, B, T);
    return hooks_ok_;
  }
  bool GradSquaredSum(size_t begin, size_t count, double* out) override {
    double sum = 0;
    for (float g : grads_.subspan(begin, count))
      sum += static_cast<double>(g) * g;
    *out = sum;
    return true;
  }

  // NCCL's part, through the host Comm as ReplicatedState's are (so the
  // results equal the CPU engine's bit for bit).
  static std::atomic<int64_t> collectives;  // run, in this process
  // What fails, to reach the engine's fallbacks: the rank whose NCCL does
  // not load, rank 0's id, the rank that cannot start joining (-1: none).
  static std::atomic<int> no_nccl_rank, bad_join_rank;
  static std::atomic<bool> no_id;
  bool CollectivesIdentity(std::string* identity) override {
    if (comm_ == nullptr || comm_->rank() == no_nccl_rank) {
      error_ = "no NCCL in this stand-in";
      return false;
    }
    *identity = gpu_;
    return true;
  }
  bool CollectivesId(std::string* id) override {
    if (no_id) {
      error_ = "no id in this stand-in";
      return false;
    }
    id->assign(128, 'x');
    return true;
  }
  bool CollectivesJoin(const std::string& id, int rank, int world,
                       double) override {
    joined_ = id == std::string(128, 'x') && rank == comm_->rank() &&
              world == comm_->size() && rank != bad_join_rank;
    if (!joined_) error_ = "this stand-in could not join";
    return joined_;
  }
  bool CollectivesWait() override { return joined_; }
  void CollectivesLeave() override { joined_ = false; }
  bool AllReduceGrads(float scale) override {
    if (!joined_ || !comm_->AllReduceSum(grads_.data(), grads_.size()).ok())
      return false;
    ++collectives;
    for (size_t i = 0; i < o_.model.num_params; ++i) grads_[i] *= scale;
    return true;
  }
  bool ReduceScatterGrads(size_t chunk, int rank, float scale) override {
    float* g = grads_.data();
    if (!Chunks(grads_.size(), chunk, rank) ||
        !comm_->ReduceScatterSum(g, g + rank * chunk, chunk).ok())
      return false;
    ++collectives;
    for (size_t i = 0; i < chunk; ++i) g[rank * chunk + i] *= scale;
    return true;
  }
  bool ScaleGrads(float scale) override {
    for (float& g : grads_) g *= scale;
    return true;
  }
  bool GatherLayerParams(int layer, size_t owned_at, size_t chunk,
                         int rank) override {
    std::vector<float>& w = param_windows_[layer == -1 ? 0 : 1];
    if (o_.windows != DeviceWindows::kParamsAndGrads ||
        !Chunks(w.size(), chunk, rank) || owned_at + chunk > params_.size())
      return false;
    std::vector<float> mine(params_.begin() + owned_at,
                            params_.begin() + owned_at + chunk);
    if (!comm_->AllGather(mine.data(), w.data(), chunk).ok()) return false;
    ++collectives;
    return true;
  }
  bool ReduceLayerGrads(int layer, size_t owned_at, size_t chunk,
                        int rank) override {
    std::vector<float>& w = grad_windows_[layer == -1 ? 0 : 1];
    if (o_.windows == DeviceWindows::kNone || !Chunks(w.size(), chunk, rank) ||
        owned_at + chunk > grads_.size())
      return false;
    std::vector<float> sum(chunk);
    if (!comm_->ReduceScatterSum(w.data(), sum.data(), chunk).ok())
      return false;
    ++collectives;
    for (size_t i = 0; i < chunk; ++i) grads_[owned_at + i] += sum[i];
    std::fill(w.begin(), w.end(), 0.0f);
    return true;
  }
  bool GatherLayerPieces(int layer, size_t at, size_t count, size_t chunk,
                         int rank) override {
    std::vector<float>& w = grad_windows_[layer == -1 ? 0 : 1];
    if (o_.windows != DeviceWindows::kGrads || !Chunks(w.size(), chunk, rank) ||
        count > chunk || at + count > params_.size())
      return false;
    std::vector<float> mine(chunk, 0.0f);
    std::copy(params_.begin() + at, params_.begin() + at + count, mine.begin());
    if (!comm_->AllGather(mine.data(), w.data(), chunk).ok()) return false;
    ++collectives;
    std::copy(w.begin(), w.begin() + LayerSize(layer),
              params_.begin() + o_.model.layer_begin[layer + 1]);
    std::fill(w.begin(), w.end(), 0.0f);
    return true;
  }
  // Joined, and every rank's chunk within n floats (as the CUDA engine
  // checks).
  bool Chunks(size_t n, size_t chunk, int rank) const {
    return joined_ && rank == comm_->rank() &&
           static_cast<size_t>(comm_->size()) * chunk <= n;
  }
  bool AllGatherParams(size_t chunk, int rank) override {
    if (!Chunks(params_.size(), chunk, rank)) return false;
    std::vector<float> mine(params_.begin() + rank * chunk,
                            params_.begin() + (rank + 1) * chunk);
    if (!joined_ || !comm_->AllGather(mine.data(), params_.data(), chunk).ok())
      return false;
    ++collectives;
    return true;
  }
  bool AdamStep(const DeviceAdam& a, float grad_scale) override {
    const AdamParams p{a.lr,           a.beta1,      a.beta2, a.eps,
                       a.weight_decay, a.adamw_mode, a.step};
    for (const DeviceAdamSegment& s : o_.adam) {
      float* g = grads_.data() + s.grad;
      for (size_t i = 0; i < s.count && grad_scale != 1.0f; ++i)
        g[i] *= grad_scale;
      worker::AdamStep(params_.data() + s.param, g, m_.data() + s.moment,
                       v_.data() + s.moment, s.count, p, s.decay);
    }
    return true;
  }
  // Records what the engine pins: every copy must be inside it.
  bool PinHost(void* p, size_t bytes) override {
    pinned_.push_back({static_cast<const char*>(p), bytes});
    return true;
  }
  int64_t peak_memory_bytes() const override { return state_bytes(); }
  int64_t state_bytes() const override {
    return 4 * static_cast<int64_t>(params_.size() + grads_.size() + m_.size() +
                                    v_.size());
  }

  // ParamSource, under windows.
  float* LayerParams(int layer) override {
    if (o_.windows == DeviceWindows::kGrads)
      return params_.data() + o_.model.layer_begin[layer + 1];
    return Window(param_windows_, layer);
  }
  float* LayerGrads(int layer) override { return Window(grad_windows_, layer); }

 private:
  CpuStandIn(const DeviceEngineOptions& o, std::unique_ptr<Model> model)
      : o_(o), model_(std::move(model)) {
    const size_t n = o.model.num_params;
    m_.assign(o.moments_count, 0.0f);
    v_.assign(o.moments_count, 0.0f);
    if (o.windows == DeviceWindows::kNone) {
      // Padded as the CUDA engine's buffers are.
      if (o.padded_floats > n) model_->PadFlatBuffers(o.padded_floats);
      params_ = model_->params();
      grads_ = model_->grads();
      return;
    }
    owned_params_.assign(
        o.windows == DeviceWindows::kParamsAndGrads ? o.owned_count : n, 0.0f);
    owned_grads_.assign(o.owned_count, 0.0f);
    params_ = owned_params_;
    grads_ = owned_grads_;
    size_t block = o.window_floats[1];
    for (int l = 0; l <= o.model.num_layers; ++l)
      block = std::max(block, LayerSize(l));
    for (auto* w : {&param_windows_, &grad_windows_}) {
      (*w)[0].assign(std::max(LayerSize(-1), o.window_floats[0]), 0.0f);
      (*w)[1].assign(block, 0.0f);
    }
    LayerHooks h;
    h.before_forward = [this](int l) {
      Call(&DeviceLayerHooks::BeforeForward, l);
    };
    h.before_backward = [this](int l) {
      Call(&DeviceLayerHooks::BeforeBackward, l);
    };
    h.after_backward = [this](int l) {
      Call(&DeviceLayerHooks::AfterBackward, l);
    };
    model_->set_hooks(std::move(h));
    model_->set_param_source(this);
  }
  void Call(bool (DeviceLayerHooks::*hook)(int), int layer) {
    if (hooks_ok_) hooks_ok_ = (o_.hooks->*hook)(layer);
  }
  size_t LayerSize(int layer) const {
    return o_.model.layer_begin[layer + 2] - o_.model.layer_begin[layer + 1];
  }
  static float* Window(std::array<std::vector<float>, 2>& w, int layer) {
    return w[layer == -1 ? 0 : 1].data();
  }
  void Check(const float* host, size_t n) {
    const auto* b = reinterpret_cast<const char*>(host);
    const size_t bytes = n * sizeof(float);
    for (const auto& [p, size] : pinned_) {
      if (b >= p && b + bytes <= p + size) return;
    }
    if (n > 0) ++unpinned_copies;
  }
  bool Copy(const float* from, std::span<float> to) {
    Check(from, to.size());
    std::copy(from, from + to.size(), to.begin());
    return true;
  }
  bool Copy(std::span<const float> from, float* to) {
    Check(to, from.size());
    std::copy(from.begin(), from.end(), to);
    return true;
  }

  DeviceEngineOptions o_;
  std::unique_ptr<Model> model_;
  std::span<float> params_, grads_;  // the model's, or the owned ones
  std::vector<float> owned_params_, owned_grads_, m_, v_;
  std::array<std::vector<float>, 2> param_windows_, grad_windows_;
  bool hooks_ok_ = true;
  std::vector<std::pair<const char*, size_t>> pinned_;
  Comm* comm_ = nullptr;
  std::string gpu_;
  bool joined_ = false;
  std::string error_;
};

std::atomic<int64_t> CpuStandIn::unpinned_copies{0};
std::atomic<int64_t> CpuStandIn::collectives{0};
std::atomic<int> CpuStandIn::no_nccl_rank{-1};
std::atomic<int> CpuStandIn::bad_join_rank{-1};
std::atomic<bool> CpuStandIn::no_id{false};

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

TEST_F(GpuEngineHostTest, EveryStageAndOffloadEqualTheCpuEngineBitForBit) {
  for (int world : {1, 2}) {
    for (int stage : {0, 1, 2, 3}) {
      const Result cpu = Train(Config(world, stage), false, world);
      ASSERT_EQ(cpu.norms.size(), 4u);
      for (Offload offload : Offloads(stage)) {
        SCOPED_TRACE("world " + std::to_string(world) + ", stage " +
                     std::to_string(stage) + Name(offload));
        const Result gpu = Train(Config(world, stage, offload), true, world);
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

// What the device holds (the stand-in's peak is its buffers) per stage on
// 2 ranks, n parameters: stage 0 parameters, gradients and both moments of
// all of them (16n); stage 1 the moments of its shard only; stage 2 whole
// parameters and the owned pieces' gradients and moments (4n + 12o, o the
// owned floats: every layer's shard); stage 3 only owned pieces (16o).
// Offloaded, the moments (and owned gradients, and under stage 3 the owned
// parameters) are the host's instead.
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
  };
  for (const Case& c : std::vector<Case>{{0, kNothing, 16 * n},
                                         {0, kOptimizer, 8 * n},
                                         {1, kNothing, 8 * n + 8 * shard},
                                         {1, kOptimizer, 8 * n},
                                         {2, kNothing, 4 * n + 12 * owned},
                                         {2, kOptimizer, 4 * n},
                                         {3, kNothing, 16 * owned},
                                         {3, kOptimizer, 0},
                                         {3, kParams, 0}}) {
    SCOPED_TRACE("stage " + std::to_string(c.stage) + Name(c.offload));
    TrainConfig config = Config(2, c.stage, c.offload);
    config.train.steps = 1;
    const Result r = Train(config, true, 2);
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

// Every stage (0 and 1 also offloaded) with a GPU per rank reduces and
// gathers on the GPUs (NCCL's part, here the stand-in's over the host Comm;
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
    // Offloaded, stages 2 and 3 exchange through host memory.
    for (Offload offload : stage < 2 ? std::vector{kNothing, kOptimizer}
                                     : std::vector{kNothing}) {
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
