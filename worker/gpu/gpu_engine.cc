// The GPU engines: a model on a DeviceEngine (worker/device_engine.h, the
// CUDA one in libdsl_cuda.so), with the optimizer on the device or
// offloaded to the CPU (offload_optimizer: {device: cpu}). The host keeps
// the state the CPU engine keeps for the same stage and the device
// computes. What ranks exchange passes through host memory (Gloo), unless
// every rank has a GPU of its own and NCCL loads everywhere: then the
// device's collectives (collectives.h) replace the host's below, and the
// host's copy serves checkpoints.
//  - stages 0 and 1 (GpuReplicatedEngine, replicated_engine.cc): the
//    device holds whole parameters and gradients; a ReplicatedState
//    (replicated_state.h) all-reduces or reduce-scatters the gradients on
//    the host, and each rank updates its shard, on the device (only that
//    shard's moments are there) or on the host, the parameters then
//    all-gathered.
//  - stages 2 and 3 (GpuShardedEngine, sharded_engine.cc): a ZeroState
//    (zero_state.h) as the CPU engine's, the device in layer-major order
//    with each layer's gradients only in a window for the pass
//    (DeviceWindows), taken to the host after the layer's backward and
//    reduce-scattered there in the buckets the CPU engine uses; under
//    stage 3 each layer's parameters come into a window from the host just
//    before the layer runs. The device keeps the owned pieces (gradients,
//    moments, and under stage 3 parameters) for its AdamW. Offloaded, the
//    host keeps them: over Gloo the device holds none; with NCCL it holds
//    the owned gradients its reduces add into (and under stage 3 the owned
//    parameters its gathers read), copied down to the host's AdamW and up
//    from it, as DeepSpeed's ZeRO-Offload moves them.
#include "worker/gpu/gpu_engine.h"

#include <cstdlib>
#include <string>

#include "worker/device_loader.h"
#include "worker/gpu/collectives.h"

namespace dslaunch::worker::gpu {

StatusOr<std::unique_ptr<Model>> GpuEngine::ReadOrCreate(
    const TrainConfig& config, const EngineOptions& options, ParamOrder order) {
  std::unique_ptr<Model> model;
  if (!options.init_model.empty()) {
    ASSIGN_OR_RETURN(model, ReadModelFile(options.init_model, order));
  } else {
    const ModelSection& m = config.model;
    ASSIGN_OR_RETURN(
        model, Model::Create(ModelConfig::Make(m.seq_len, m.vocab_size,
                                               m.n_layer, m.n_head, m.n_embd),
                             order));
  }
  layout_ = std::make_unique<ParamLayout>(model->layout());
  return model;
}

DeviceEngineOptions GpuEngine::BaseOptions(const TrainConfig& config,
                                           const EngineOptions& options) const {
  const ParamLayout& layout = *layout_;
  const ModelConfig& mc = layout.config();
  DeviceEngineOptions o;
  DeviceModelSpec& s = o.model;
  s.max_seq_len = mc.max_seq_len;
  s.vocab_size = mc.vocab_size;
  s.padded_vocab_size = mc.padded_vocab_size;
  s.num_layers = mc.num_layers;
  s.num_heads = mc.num_heads;
  s.channels = mc.channels;
  s.num_params = layout.num_params();
  for (int k = 0; k < kNumParamKinds; ++k) {
    const auto kind = static_cast<ParamKind>(k);
    s.offset[k] = layout.Offset(kind, 0);
    // Instance 1's offset where there is one; any stride serves one layer.
    s.stride[k] = !IsPerLayer(kind)   ? 0
                  : mc.num_layers > 1 ? layout.Offset(kind, 1) - s.offset[k]
                                      : layout.Size(kind);
  }
  if (layout.order() == ParamOrder::kLayerMajor) {
    for (int l = -1; l <= mc.num_layers; ++l)
      s.layer_begin.push_back(layout.LayerRanges(l).at(0).begin);
    s.layer_begin.push_back(layout.num_params());
  }
  std::string why;
  o.device = DeviceForLocalRank(options.local_rank, CudaDeviceCount(&why));
  // fp32 configs compute exact fp32 products unless DSL_CUDA_TF32=1 lets
  // the tensor cores round their inputs to tf32 (PyTorch's allow_tf32).
  const char* tf32 = std::getenv("DSL_CUDA_TF32");
  o.precision = config.bf16           ? DevicePrecision::kBf16
                : config.fp16.enabled ? DevicePrecision::kFp16
                : tf32 != nullptr && std::string(tf32) == "1"
                    ? DevicePrecision::kTf32
                    : DevicePrecision::kFp32;
  return o;
}

void GpuEngine::Pin(const std::vector<std::span<float>>& buffers) {
  for (std::span<float> b : buffers) {
    if (!dev_->PinHost(b.data(), b.size_bytes())) pinned_ = false;
  }
}

std::string GpuEngine::DescribeDevice() const {
  return "GPU " + dev_->Describe() +
         (pinned_ ? "" : ", host buffers pageable (page-locking failed)");
}

Status GpuEngine::SetUpCollectives() {
  if (comm_->size() == 1 && !NcclForced()) return Status::Ok();
  ASSIGN_OR_RETURN(Collectives c, ChooseCollectives(*comm_, *dev_));
  nccl_ = c.nccl;
  collectives_ = c.describe;
  return Status::Ok();
}

}  // namespace dslaunch::worker::gpu

namespace dslaunch::worker {

StatusOr<std::unique_ptr<Engine>> MakeGpuEngine(const TrainConfig& config,
                                                Comm* comm,
                                                const EngineOptions& options,
                                                const DeviceOpener& open) {
  if (config.zero.stage >= 2)
    return gpu::MakeShardedEngine(config, comm, options, open);
  return gpu::MakeReplicatedEngine(config, comm, options, open);
}

}  // namespace dslaunch::worker
