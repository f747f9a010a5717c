// NcclComm: NCCL collectives among the ranks' GPUs for the CUDA engine,
// with libnccl.so.2 opened by dlopen on first use (a machine without NCCL
// runs the CPU-side Gloo path instead), the communicator made without
// blocking and every collective waited for with a deadline: a peer that
// is gone or stuck makes the wait end in ncclCommAbort and an error, never
// a hang. Internal to libdsl_cuda; one per engine, on the engine's stream.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <string>

namespace dslaunch::worker::cuda {

class NcclComm {
 public:
  NcclComm() = default;
  ~NcclComm();
  NcclComm(const NcclComm&) = delete;
  NcclComm& operator=(const NcclComm&) = delete;

  // Loads NCCL (once per process); false with the reason in error().
  bool Load();
  // A fresh unique id (rank 0), 128 bytes.
  bool UniqueId(std::string* id);
  // Starts joining rank `rank` of `world` with the id rank 0 made (returns
  // at once); Ready waits at most timeout_s for every rank. Every later
  // wait has the same deadline.
  bool Join(const std::string& id, int rank, int world, double timeout_s);
  bool Ready();
  bool joined() const { return comm_ != nullptr; }
  // Aborts the communicator (after an error, or to fall back).
  void Abort();
  // Finalizes (waiting at most the deadline: every rank on a machine must
  // take part) and destroys it; aborts on an error or the deadline. The
  // destructor does this if it was not done.
  void Close();

  // fp32 sums in place on `stream`, waited for (deadline: the Join's).
  bool AllReduceSum(float* data, size_t n, cudaStream_t stream);
  // data: world chunks of `chunk`; this rank's summed chunk in place at
  // data + rank * chunk.
  bool ReduceScatterSum(float* data, size_t chunk, int rank,
                        cudaStream_t stream);
  // data + rank * chunk from every rank into data (world chunks).
  bool AllGather(float* data, size_t chunk, int rank, cudaStream_t stream);

  const std::string& error() const { return error_; }

 private:
  bool Check(int result, const char* what);
  bool NoComm(const char* what);
  // Until the communicator is idle (async error not in progress) and, with
  // a stream, its work done; aborts at the deadline.
  bool Wait(cudaStream_t stream, const char* what);

  void* comm_ = nullptr;  // ncclComm_t
  double timeout_s_ = 300;
  std::string error_;
};

}  // namespace dslaunch::worker::cuda
