// GpuEngine: what the GPU engines share (a model on a DeviceEngine, its
// options, passes and collectives), and the engines' makers. Internal to
// worker/gpu/ (gpu_engine.cc tells how the engines work); the Trainer owns
// an engine through MakeGpuEngine (worker/engine.h), on its thread.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "worker/device_engine.h"
#include "worker/engine.h"
#include "worker/model.h"

namespace dslaunch::worker::gpu {

// What both GPU engines do alike: the device, its options and its passes.
class GpuEngine : public Engine {
 public:
  const ModelConfig& model_config() const override { return layout_->config(); }
  size_t num_params() const override { return layout_->num_params(); }

  StatusOr<float> TrainMicroBatch(const Batch& b, float grad_scale) override {
    float loss = 0;
    RETURN_IF_ERROR(
        Ok(dev_->TrainMicroBatch(b.inputs.data(), b.targets.data(),
                                 b.batch_size, b.seq_len, grad_scale, &loss)));
    return loss;
  }
  StatusOr<float> EvalBatch(const Batch& b) override {
    float loss = 0;
    RETURN_IF_ERROR(Ok(dev_->EvalBatch(b.inputs.data(), b.targets.data(),
                                       b.batch_size, b.seq_len, &loss)));
    return loss;
  }
  int64_t device_memory_bytes() const override {
    return dev_->peak_memory_bytes();
  }

 protected:
  explicit GpuEngine(Comm* comm) : comm_(comm) {}

  // The model's parameters in `order`: from options.init_model, or the
  // GPT-2 init with train.seed (the layout then set, the parameters not).
  StatusOr<std::unique_ptr<Model>> ReadOrCreate(const TrainConfig& config,
                                                const EngineOptions& options,
                                                ParamOrder order);

  // The options every mode shares: the spec of layout_, the GPU for this
  // rank, the precision.
  DeviceEngineOptions BaseOptions(const TrainConfig& config,
                                  const EngineOptions& options) const;

  Status Ok(bool ok) const {
    if (ok) return Status::Ok();
    return Internal("GPU: " + dev_->error());
  }
  // Page-locks the host buffers the device copies to and from (each
  // derived engine's destructor drops dev_ first, which releases them).
  void Pin(const std::vector<std::span<float>>& buffers);
  // What Describe adds about the device and host memory.
  std::string DescribeDevice() const;
  // What Describe adds about the collectives: "" on one rank.
  std::string DescribeCollectives() const {
    return collectives_.empty() ? "" : ", collectives " + collectives_;
  }
  // The global gradient norm from this rank's sum of squares of what it
  // updates: the partials summed over ranks in fp32, as the CPU engines
  // sum theirs (collective).
  StatusOr<float> GlobalNorm(double squares) {
    float partial = static_cast<float>(squares);
    RETURN_IF_ERROR(comm_->AllReduceSum(&partial, 1));
    return std::sqrt(partial);
  }
  // A step of the host's (an optimizer step, a gather) over its parameter
  // buffer `params`, each range it finishes started on its way to the
  // device's while the host goes on with the next; every copy waited for
  // whatever the step returns (they read host memory).
  template <typename Step>
  Status UpdatingTheDevice(const float* params, const Step& step) {
    const Status st = step([&](size_t begin, size_t count) {
      return Ok(dev_->StartSetParams(begin, count, params + begin));
    });
    const bool waited = dev_->WaitSetParams();
    RETURN_IF_ERROR(st);
    return Ok(waited);
  }
  static DeviceAdam ToDevice(const AdamParams& a) {
    return {a.lr,           a.beta1,      a.beta2, a.eps,
            a.weight_decay, a.adamw_mode, a.step};
  }

  // The ranks' collectives (worker/gpu/collectives.h), when there are several
  // or DSL_NCCL=1 asks for NCCL on one.
  Status SetUpCollectives();

  Comm* comm_;
  bool offload_ = false;
  bool pinned_ = true;
  bool nccl_ = false;        // the collectives run on the GPUs
  std::string collectives_;  // which and why, for Describe; "" on one rank
  std::unique_ptr<ParamLayout> layout_;
  std::unique_ptr<DeviceEngine> dev_;
};

// An engine E (a GpuEngine with Init), made and initialized.
template <typename E>
StatusOr<std::unique_ptr<Engine>> MakeInitialized(const TrainConfig& config,
                                                  Comm* comm,
                                                  const EngineOptions& options,
                                                  const DeviceOpener& open) {
  auto e = std::make_unique<E>(comm);
  RETURN_IF_ERROR(e->Init(config, options, open));
  return std::unique_ptr<Engine>(std::move(e));
}

// The engine of each kind, initialized: stages 0 and 1
// (replicated_engine.cc), stages 2 and 3 (sharded_engine.cc).
StatusOr<std::unique_ptr<Engine>> MakeReplicatedEngine(
    const TrainConfig& config, Comm* comm, const EngineOptions& options,
    const DeviceOpener& open);
StatusOr<std::unique_ptr<Engine>> MakeShardedEngine(
    const TrainConfig& config, Comm* comm, const EngineOptions& options,
    const DeviceOpener& open);

}  // namespace dslaunch::worker::gpu
