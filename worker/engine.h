// Engine: one rank's model, gradients and optimizer state for one ZeRO stage
// on one device, behind one interface, so that the Trainer's loop has no
// branch on the stage or the device. MakeEngine picks the implementation:
//  - replicated (engine.cc): stages 0 and 1 on the CPU. Every rank holds
//    whole parameters and gradients; stage 0 all-reduces the gradients and
//    updates everything, stage 1 reduce-scatters them, updates its own piece
//    (its moments only for that piece) and all-gathers the parameters.
//  - sharded (engine.cc): stages 2 and 3 on the CPU through ZeroState
//    (gradients, and under stage 3 parameters, in per-rank pieces).
//  - GPU (worker/gpu/): stages 0-3 on a DeviceEngine (libdsl_cuda.so),
//    the gradients reduced across ranks on the GPUs over NCCL where each
//    rank has one, else through host memory over Gloo, the optimizer
//    on the device or offloaded to the CPU; the host side of stages 0 and 1
//    a ReplicatedState (replicated_state.h) as the replicated engine's, of
//    stages 2 and 3 a ZeroState as the sharded engine's, the device calling
//    it around each layer.
// Checkpoints are the same for all: llm.c's order, each rank writing its
// range of the partition (worker/checkpoint.h), so any engine resumes any
// other's at any world size.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "base/status.h"
#include "worker/checkpoint.h"
#include "worker/comm.h"
#include "worker/cpu_adam.h"
#include "worker/data_loader.h"
#include "worker/device_loader.h"
#include "worker/param_layout.h"
#include "worker/train_config.h"

namespace dslaunch::worker {

class Engine {
 public:
  virtual ~Engine() = default;
  virtual const ModelConfig& model_config() const = 0;
  virtual size_t num_params() const = 0;

  // Before a step's micro-batches.
  virtual Status ZeroGrad() = 0;
  // Forward and backward, adding the gradient of grad_scale * (mean loss);
  // returns the micro-batch's mean loss.
  virtual StatusOr<float> TrainMicroBatch(const Batch& b, float grad_scale) = 0;
  virtual StatusOr<float> EvalBatch(const Batch& b) = 0;
  // The gradients averaged over ranks (collective); their global L2 norm.
  virtual StatusOr<float> FinishGradients() = 0;
  // One optimizer step, the gradients scaled by clip_scale first.
  virtual Status Update(const AdamParams& adam, float clip_scale) = 0;

  // Parameters and moments of [begin, begin + count) in llm.c's order, for
  // this rank's part of a checkpoint; valid until the next call. Collective
  // where the state is sharded.
  virtual StatusOr<RankShard> CheckpointRange(size_t begin, size_t count) = 0;
  // This rank's state from a complete checkpoint of this model, written at
  // any world size by any engine.
  virtual Status Resume(const std::string& dir) = 0;
  // Every parameter in llm.c's order (collective where sharded).
  virtual StatusOr<std::vector<float>> WholeParams() = 0;

  // Parameters, gradients and optimizer state this rank holds, in bytes.
  virtual int64_t state_bytes() const = 0;
  // The device's allocator peak in bytes; 0 on the CPU.
  virtual int64_t device_memory_bytes() const { return 0; }
  // What the summary line adds about this engine ("3 gradient buckets",
  // "GPU NVIDIA H200, sm_90, 139.8 GiB, bf16"), or "".
  virtual std::string Describe() const = 0;
};

struct EngineOptions {
  std::string init_model;  // an llm.c model file instead of random init
  DeviceKind device = DeviceKind::kCpu;  // resolved: kCpu or kCuda
  int local_rank = 0;                    // picks the GPU
};

// The engine for config's stage on options.device, its parameters from
// init_model or the GPT-2 init with train.seed. InvalidArgument for what
// the device cannot train (fp16/bf16 on the CPU).
StatusOr<std::unique_ptr<Engine>> MakeEngine(const TrainConfig& config,
                                             Comm* comm,
                                             const EngineOptions& options);

// Makes the GPU engine's DeviceEngine: OpenCudaEngine (libdsl_cuda.so), or
// in tests a stand-in on the CPU that drives the GPU engine's host side.
using DeviceOpener = std::function<StatusOr<std::unique_ptr<DeviceEngine>>(
    const DeviceEngineOptions&)>;

// Defined in worker/gpu/gpu_engine.cc.
StatusOr<std::unique_ptr<Engine>> MakeGpuEngine(
    const TrainConfig& config, Comm* comm, const EngineOptions& options,
    const DeviceOpener& open = OpenCudaEngine);

}  // namespace dslaunch::worker
