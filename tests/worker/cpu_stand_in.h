// CpuStandIn: a DeviceEngine whose "device" is host memory, so that the GPU
// engines' host side (worker/gpu/) runs on machines without a GPU and must
// give the CPU engine's results bit for bit (gpu_engine_host_test.cc), and
// counts what crosses between host and device (gpu_engine_copies_test.cc).
// Test-only.
#pragma once

#include <algorithm>
#include <array>
#include <atomic>
#include <cmath>
#include <cstring>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "worker/comm.h"
#include "worker/cpu_adam.h"
#include "worker/device_engine.h"
#include "worker/engine.h"
#include "worker/flat_math.h"
#include "worker/model.h"

namespace dslaunch::worker {

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

  // Copies from and to host memory the engine did not pin, and the floats
  // copied either way, in every stand-in of this process.
  inline static std::atomic<int64_t> unpinned_copies{0}, copied_floats{0};

  bool SetParams(const float* host) override { return Copy(host, params_); }
  bool GetParams(float* host) override {
    return NoParamCopies() && Copy(params_, host);
  }
  bool SetGrads(const float* host) override { return Copy(host, grads_); }
  bool GetGrads(float* host) override { return Copy(grads_, host); }
  bool GetParamsRange(size_t begin, size_t count, float* host) override {
    if (begin > params_.size() || count > params_.size() - begin) {
      error_ = "GetParamsRange past the parameters";
      return false;
    }
    return NoParamCopies() && Copy(params_.subspan(begin, count), host);
  }
  bool SetGradsRange(size_t begin, size_t count, const float* host) override {
    if (begin > grads_.size() || count > grads_.size() - begin) {
      error_ = "SetGradsRange past the gradients";
      return false;
    }
    return Copy(host, grads_.subspan(begin, count));
  }
  bool GetGradsRange(size_t begin, size_t count, float* host) override {
    if (begin > grads_.size() || count > grads_.size() - begin) {
      error_ = "GetGradsRange past the gradients";
      return false;
    }
    return Copy(grads_.subspan(begin, count), host);
  }
  bool SetMoments(const float* m, const float* v) override {
    return Copy(m, m_) && Copy(v, v_);
  }
  bool GetMoments(float* m, float* v) override {
    return Copy(m_, m) && Copy(v_, v);
  }
  // As asynchronous copies: the host's values reach the parameters only
  // at WaitSetParams, with NaN there until then (what a pass before the
  // wait could read). The host changing a range before the wait (a real
  // copy could read either value), a pass, a read or a step with copies
  // unwaited, and a wait for nothing fail.
  inline static std::atomic<int64_t> param_copies{0};   // started
  inline static std::atomic<int> most_param_copies{0};  // at once
  bool StartSetParams(size_t begin, size_t count, const float* host) override {
    if (begin > params_.size() || count > params_.size() - begin) {
      error_ = "StartSetParams past the parameters";
      return false;
    }
    Check(host, count);
    param_copies_.push_back(
        {begin, {host, std::vector<float>(host, host + count)}});
    std::fill_n(params_.begin() + begin, count, NAN);
    ++param_copies;
    most_param_copies = std::max<int>(most_param_copies,
                                      static_cast<int>(param_copies_.size()));
    return true;
  }
  bool WaitSetParams() override {
    if (param_copies_.empty()) {
      error_ = "a wait for no parameter copy";
      return false;
    }
    bool ok = true;
    for (const auto& [begin, copy] : param_copies_) {
      const auto& [host, values] = copy;
      ok = ok && std::equal(values.begin(), values.end(), host,
                            [](float a, float b) { return Same(a, b); });
      std::copy(values.begin(), values.end(), params_.begin() + begin);
    }
    param_copies_.clear();
    if (!ok) error_ = "the host changed parameters while their copy ran";
    return ok;
  }
  bool SetLayerParams(int layer, const float* host) override {
    if (o_.windows != DeviceWindows::kParamsAndGrads) return false;
    Check(host, LayerSize(layer));
    std::copy(host, host + LayerSize(layer), Window(param_windows_, layer));
    return true;
  }
  // As an asynchronous copy: the window's gradients as they are now reach
  // `host` only at WaitLayerGrads, with NaN there until then (what a read
  // before the copy ends could see). A write there in between (which a
  // real copy could land over), a layer taken twice without a wait, a wait
  // for nothing and a pass that ends with a copy unwaited fail.
  bool TakeLayerGrads(int layer, float* host) override {
    if (o_.windows == DeviceWindows::kNone) return false;
    if (copies_.count(layer) != 0) {
      error_ = "a gradient copy of layer " + std::to_string(layer) +
               " started twice";
      return false;
    }
    float* w = Window(grad_windows_, layer);
    Check(host, LayerSize(layer));
    copies_[layer] = {host, std::vector<float>(w, w + LayerSize(layer))};
    std::fill(host, host + LayerSize(layer), NAN);
    std::fill(w, w + LayerSize(layer), 0.0f);
    return true;
  }
  bool WaitLayerGrads(int layer) override {
    auto it = copies_.find(layer);
    if (it == copies_.end()) {
      error_ = "a wait for no gradient copy of layer " + std::to_string(layer);
      return false;
    }
    float* host = it->second.first;
    if (!std::all_of(host, host + it->second.second.size(),
                     [](float x) { return std::isnan(x); })) {
      error_ = "the host wrote where a gradient copy was landing";
      return false;
    }
    std::copy(it->second.second.begin(), it->second.second.end(),
              it->second.first);
    copies_.erase(it);
    return true;
  }
  bool ZeroGrad() override {
    std::fill(grads_.begin(), grads_.end(), 0.0f);
    return true;
  }
  bool TrainMicroBatch(const int* tokens, const int* targets, int B, int T,
                       float grad_scale, float* loss) override {
    if (!NoParamCopies()) return false;
    if (!copies_.empty()) {
      error_ = "a pass began with a gradient copy of the last unwaited";
      return false;
    }
    hooks_ok_ = true;
    *loss = model_->Forward(tokens, targets, B, T);
    model_->Backward(grad_scale);
    if (hooks_ok_ && !copies_.empty()) {
      error_ = "a pass ended with a gradient copy nobody waited for";
      return false;
    }
    return hooks_ok_;
  }
  bool EvalBatch(const int* tokens, const int* targets, int B, int T,
                 float* loss) override {
    if (!NoParamCopies()) return false;
    hooks_ok_ = true;
    *loss = model_->Forward(tokens, targets, B, T);
    return hooks_ok_;
  }
  bool GradSquaredSum(size_t begin, size_t count, double* out) override {
    *out = SquaredSum(grads_.subspan(begin, count));
    return true;
  }

  // NCCL's part, through the host Comm as ReplicatedState's are (so the
  // results equal the CPU engine's bit for bit).
  inline static std::atomic<int64_t> collectives{0};  // run, in this process
  // What fails, to reach the engine's fallbacks: the rank whose NCCL does
  // not load, rank 0's id, the rank that cannot start joining (-1: none).
  inline static std::atomic<int> no_nccl_rank{-1}, bad_join_rank{-1};
  inline static std::atomic<bool> no_id{false};
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
  // The rank whose AllocateOwned runs out of memory (-1: none).
  inline static std::atomic<int> no_memory_rank{-1};
  bool AllocateOwned(size_t count) override {
    if (comm_ != nullptr && comm_->rank() == no_memory_rank) {
      error_ = "out of memory in this stand-in";
      return false;
    }
    const bool params = o_.windows == DeviceWindows::kParamsAndGrads;
    if (o_.windows == DeviceWindows::kNone || !grads_.empty() ||
        (params && !params_.empty())) {
      error_ = "AllocateOwned: not under windows opened without owned buffers";
      return false;
    }
    owned_grads_.assign(count, 0.0f);
    grads_ = owned_grads_;
    if (params) {
      owned_params_.assign(count, 0.0f);
      params_ = owned_params_;
    }
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
    if (!NoParamCopies()) return false;
    const AdamParams p{a.lr,           a.beta1,      a.beta2, a.eps,
                       a.weight_decay, a.adamw_mode, a.step,  grad_scale};
    for (const DeviceAdamSegment& s : o_.adam) {
      worker::AdamStep(params_.data() + s.param, grads_.data() + s.grad,
                       m_.data() + s.moment, v_.data() + s.moment, s.count, p,
                       s.decay);
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
  bool NoParamCopies() {
    if (param_copies_.empty()) return true;
    error_ = "parameters used with their copy to the device unwaited";
    return false;
  }
  // The same bits (NaN included).
  static bool Same(float a, float b) {
    return std::memcmp(&a, &b, sizeof a) == 0;
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
    copied_floats += static_cast<int64_t>(n);
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
  // The gradient copies started and not yet waited for, by layer.
  std::map<int, std::pair<float*, std::vector<float>>> copies_;
  // The parameter copies started and not yet waited for: where, from
  // where, and what the host held then.
  std::vector<std::pair<size_t, std::pair<const float*, std::vector<float>>>>
      param_copies_;
  std::vector<std::pair<const char*, size_t>> pinned_;
  Comm* comm_ = nullptr;
  std::string gpu_;
  bool joined_ = false;
  std::string error_;
};

}  // namespace dslaunch::worker
