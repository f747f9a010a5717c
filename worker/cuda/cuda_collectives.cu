// CudaEngine (cuda_engine.h): the collectives among the ranks' GPUs
// (NCCL, nccl_comm.h), on the whole buffers and on the layer windows.
#include "worker/cuda/cuda_engine.h"

namespace dslaunch::worker::cuda {

bool CudaEngine::CollectivesIdentity(std::string* identity) {
  if (!nccl_.Load()) return Fail(nccl_.error());
  cudaDeviceProp prop{};
  if (!Cuda(cudaGetDeviceProperties(&prop, options_.device),
            "cudaGetDeviceProperties"))
    return false;
  // The UUID: the same GPU seen from two containers is one.
  identity->assign(prop.uuid.bytes, sizeof prop.uuid.bytes);
  return true;
}

bool CudaEngine::CollectivesId(std::string* id) {
  return nccl_.UniqueId(id) || Fail(nccl_.error());
}

bool CudaEngine::CollectivesJoin(const std::string& id, int rank, int world,
                                 double timeout_s) {
  nccl_world_ = world;
  return nccl_.Join(id, rank, world, timeout_s) || Fail(nccl_.error());
}

bool CudaEngine::CollectivesWait() {
  return nccl_.Ready() || Fail(nccl_.error());
}

bool CudaEngine::AllReduceGrads(float scale) {
  Mark(Profile::kCollectives);
  if (!nccl_.AllReduceSum(grads_, grad_count_, ctx_.stream))
    return Fail(nccl_.error());
  Scale(ctx_, grads_, spec_.num_params, scale);
  return Launched("scale the gradients");
}

bool CudaEngine::ReduceScatterGrads(size_t chunk, int rank, float scale) {
  if (!Chunks(chunk, rank, grad_count_))
    return Fail("ReduceScatterGrads past the gradients");
  Mark(Profile::kCollectives);
  if (!nccl_.ReduceScatterSum(grads_, chunk, rank, ctx_.stream))
    return Fail(nccl_.error());
  Scale(ctx_, grads_ + rank * chunk, chunk, scale);
  return Launched("scale the gradients");
}

bool CudaEngine::ScaleGrads(float scale) {
  Scale(ctx_, grads_, grad_count_, scale);
  return Launched("scale the gradients");
}

bool CudaEngine::GatherLayerParams(int layer, size_t owned_at, size_t chunk,
                                   int rank) {
  if (options_.windows != DeviceWindows::kParamsAndGrads ||
      !InWindow(layer, chunk, rank) || owned_at + chunk > param_count_)
    return Fail("GatherLayerParams outside its buffers");
  float* w = ParamWindow(layer);
  Mark(Profile::kCollectives);
  return Cuda(cudaMemcpyAsync(w + rank * chunk, params_ + owned_at,
                              chunk * sizeof(float), cudaMemcpyDeviceToDevice,
                              ctx_.stream),
              "copy a piece") &&
         (nccl_.AllGather(w, chunk, rank, ctx_.stream) || Fail(nccl_.error()));
}

bool CudaEngine::ReduceLayerGrads(int layer, size_t owned_at, size_t chunk,
                                  int rank) {
  if (options_.windows == DeviceWindows::kNone ||
      !InWindow(layer, chunk, rank) || owned_at + chunk > grad_count_)
    return Fail("ReduceLayerGrads outside its buffers");
  float* w = GradWindow(layer);
  Mark(Profile::kCollectives);
  if (!nccl_.ReduceScatterSum(w, chunk, rank, ctx_.stream))
    return Fail(nccl_.error());
  ResidualForward(ctx_, grads_ + owned_at, grads_ + owned_at, w + rank * chunk,
                  chunk);
  Zero(ctx_, w, WindowFloats(layer));
  return Launched("add a reduced piece");
}

bool CudaEngine::GatherLayerPieces(int layer, size_t at, size_t count,
                                   size_t chunk, int rank) {
  if (options_.windows != DeviceWindows::kGrads ||
      !InWindow(layer, chunk, rank) || count > chunk ||
      at + count > param_count_)
    return Fail("GatherLayerPieces outside its buffers");
  // The gradient window serves: the pass is over.
  float* w = GradWindow(layer);
  Mark(Profile::kCollectives);
  Zero(ctx_, w + rank * chunk, chunk);
  if (!Cuda(
          cudaMemcpyAsync(w + rank * chunk, params_ + at, count * sizeof(float),
                          cudaMemcpyDeviceToDevice, ctx_.stream),
          "copy a piece") ||
      !(nccl_.AllGather(w, chunk, rank, ctx_.stream) || Fail(nccl_.error())))
    return false;
  const bool ok = Cuda(cudaMemcpyAsync(params_ + LayerBegin(layer), w,
                                       LayerSize(layer) * sizeof(float),
                                       cudaMemcpyDeviceToDevice, ctx_.stream),
                       "copy a layer");
  Zero(ctx_, w, WindowFloats(layer));
  return ok && Launched("gather a layer");
}

bool CudaEngine::AllGatherParams(size_t chunk, int rank) {
  if (!Chunks(chunk, rank, param_count_))
    return Fail("AllGatherParams past the parameters");
  Mark(Profile::kCollectives);
  return nccl_.AllGather(params_, chunk, rank, ctx_.stream) ||
         Fail(nccl_.error());
}

bool CudaEngine::AllocateOwned(size_t count) {
  const bool params = options_.windows == DeviceWindows::kParamsAndGrads;
  if (options_.windows == DeviceWindows::kNone || grad_count_ != 0 ||
      (params && param_count_ != 0))
    return Fail(
        "AllocateOwned: not under windows opened without owned buffers");
  if (!AllocZero(&grads_, count)) return false;
  grad_count_ = count;
  if (params) {
    if (!AllocZero(&params_, count)) return false;
    param_count_ = count;
  }
  return Sync("AllocateOwned");
}

}  // namespace dslaunch::worker::cuda
