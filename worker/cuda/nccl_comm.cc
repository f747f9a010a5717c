#include "worker/cuda/nccl_comm.h"

#include <dlfcn.h>
#include <nccl.h>

#include <chrono>
#include <cstring>
#include <mutex>
#include <thread>

namespace dslaunch::worker::cuda {
namespace {

// The NCCL functions this uses, from libnccl.so.2.
struct Api {
  void* handle = nullptr;
  std::string error;  // why handle is null
  ncclResult_t (*get_unique_id)(ncclUniqueId*);
  ncclResult_t (*init_rank_config)(ncclComm_t*, int, ncclUniqueId, int,
                                   ncclConfig_t*);
  ncclResult_t (*async_error)(ncclComm_t, ncclResult_t*);
  ncclResult_t (*all_reduce)(const void*, void*, size_t, ncclDataType_t,
                             ncclRedOp_t, ncclComm_t, cudaStream_t);
  ncclResult_t (*reduce_scatter)(const void*, void*, size_t, ncclDataType_t,
                                 ncclRedOp_t, ncclComm_t, cudaStream_t);
  ncclResult_t (*all_gather)(const void*, void*, size_t, ncclDataType_t,
                             ncclComm_t, cudaStream_t);
  ncclResult_t (*abort)(ncclComm_t);
  ncclResult_t (*finalize)(ncclComm_t);
  ncclResult_t (*destroy)(ncclComm_t);
  const char* (*error_string)(ncclResult_t);
};

template <typename F>
bool Resolve(Api& api, F* f, const char* name) {
  *f = reinterpret_cast<F>(dlsym(api.handle, name));
  if (*f == nullptr) api.error = std::string("libnccl.so.2 lacks ") + name;
  return *f != nullptr;
}

const Api& Nccl() {
  static Api api;
  static std::once_flag once;
  std::call_once(once, [] {
    api.handle = dlopen("libnccl.so.2", RTLD_NOW | RTLD_LOCAL);
    if (api.handle == nullptr) {
      api.error = std::string("cannot open NCCL: ") + dlerror();
      return;
    }
    if (!Resolve(api, &api.get_unique_id, "ncclGetUniqueId") ||
        !Resolve(api, &api.init_rank_config, "ncclCommInitRankConfig") ||
        !Resolve(api, &api.async_error, "ncclCommGetAsyncError") ||
        !Resolve(api, &api.all_reduce, "ncclAllReduce") ||
        !Resolve(api, &api.reduce_scatter, "ncclReduceScatter") ||
        !Resolve(api, &api.all_gather, "ncclAllGather") ||
        !Resolve(api, &api.abort, "ncclCommAbort") ||
        !Resolve(api, &api.finalize, "ncclCommFinalize") ||
        !Resolve(api, &api.destroy, "ncclCommDestroy") ||
        !Resolve(api, &api.error_string, "ncclGetErrorString")) {
      dlclose(api.handle);
      api.handle = nullptr;
    }
  });
  return api;
}

ncclComm_t C(void* p) { return static_cast<ncclComm_t>(p); }

}  // namespace

NcclComm::~NcclComm() { Close(); }

void NcclComm::Abort() {
  if (comm_ == nullptr) return;
  Nccl().abort(C(comm_));
  comm_ = nullptr;
}

void NcclComm::Close() {
  if (comm_ == nullptr) return;
  // Finalizing flushes this rank's work and is collective within a
  // machine; non-blocking, so it is waited for with the deadline (an error
  // or the deadline aborts instead, and comm_ is then gone).
  const ncclResult_t r = Nccl().finalize(C(comm_));
  if (r != ncclSuccess && r != ncclInProgress) {
    Abort();
    return;
  }
  if (!Wait(nullptr, "finalize")) return;
  Nccl().destroy(C(comm_));
  comm_ = nullptr;
}

bool NcclComm::Load() {
  if (Nccl().handle != nullptr) return true;
  error_ = Nccl().error;
  return false;
}

bool NcclComm::NoComm(const char* what) {
  error_ = std::string("NCCL ") + what +
           ": no communicator (none joined, or "
           "aborted after an error)";
  return false;
}

bool NcclComm::Check(int result, const char* what) {
  const auto r = static_cast<ncclResult_t>(result);
  if (r == ncclSuccess || r == ncclInProgress) return true;
  error_ = std::string("NCCL ") + what + ": " + Nccl().error_string(r);
  Abort();  // a communicator with an error is aborted, not destroyed
  return false;
}

bool NcclComm::UniqueId(std::string* id) {
  if (!Load()) return false;
  ncclUniqueId u;
  if (!Check(Nccl().get_unique_id(&u), "unique id")) return false;
  id->assign(u.internal, sizeof u.internal);
  return true;
}

bool NcclComm::Join(const std::string& id, int rank, int world,
                    double timeout_s) {
  if (!Load()) return false;
  ncclUniqueId u;
  if (id.size() != sizeof u.internal) {
    error_ = "NCCL: a unique id of " + std::to_string(id.size()) + " bytes";
    return false;
  }
  std::memcpy(u.internal, id.data(), sizeof u.internal);
  timeout_s_ = timeout_s;
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;  // returns at once; Wait polls with a deadline
  ncclComm_t comm = nullptr;
  const ncclResult_t r =
      Nccl().init_rank_config(&comm, world, u, rank, &config);
  comm_ = comm;
  if (!Check(r, "communicator")) {
    Abort();
    return false;
  }
  return true;
}

bool NcclComm::Ready() {
  if (comm_ == nullptr) return NoComm("communicator");
  return Wait(nullptr, "communicator");
}

bool NcclComm::Wait(cudaStream_t stream, const char* what) {
  using Clock = std::chrono::steady_clock;
  const auto deadline =
      Clock::now() + std::chrono::duration_cast<Clock::duration>(
                         std::chrono::duration<double>(timeout_s_));
  for (int spin = 0;; ++spin) {
    ncclResult_t state = ncclSuccess;
    Nccl().async_error(C(comm_), &state);
    bool done = state != ncclInProgress;
    if (state != ncclSuccess && state != ncclInProgress) {
      error_ = std::string("NCCL ") + what + ": " + Nccl().error_string(state);
      Abort();
      return false;
    }
    if (done && stream != nullptr) {
      const cudaError_t e = cudaStreamQuery(stream);
      if (e != cudaSuccess && e != cudaErrorNotReady) {
        error_ = std::string("NCCL ") + what + ": " + cudaGetErrorString(e);
        Abort();
        return false;
      }
      done = e == cudaSuccess;
    }
    if (done) return true;
    if (Clock::now() > deadline) {
      error_ = std::string("NCCL ") + what + " did not finish within " +
               std::to_string(static_cast<int>(timeout_s_)) +
               " s: a peer is gone or stuck (the communicator is aborted)";
      Abort();
      return false;
    }
    // Spin briefly (a step's collectives take microseconds to
    // milliseconds), then yield the core.
    if (spin > 1000) std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
}

bool NcclComm::AllReduceSum(float* data, size_t n, cudaStream_t stream) {
  if (comm_ == nullptr) return NoComm("all-reduce");
  return Check(Nccl().all_reduce(data, data, n, ncclFloat32, ncclSum, C(comm_),
                                 stream),
               "all-reduce") &&
         Wait(stream, "all-reduce");
}

bool NcclComm::ReduceScatterSum(float* data, size_t chunk, int rank,
                                cudaStream_t stream) {
  if (comm_ == nullptr) return NoComm("reduce-scatter");
  return Check(Nccl().reduce_scatter(data, data + rank * chunk, chunk,
                                     ncclFloat32, ncclSum, C(comm_), stream),
               "reduce-scatter") &&
         Wait(stream, "reduce-scatter");
}

bool NcclComm::AllGather(float* data, size_t chunk, int rank,
                         cudaStream_t stream) {
  if (comm_ == nullptr) return NoComm("all-gather");
  return Check(Nccl().all_gather(data + rank * chunk, data, chunk, ncclFloat32,
                                 C(comm_), stream),
               "all-gather") &&
         Wait(stream, "all-gather");
}

}  // namespace dslaunch::worker::cuda
