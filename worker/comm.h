// Comm: the collectives the engine needs (all-reduce, reduce-scatter,
// all-gather, broadcast, barrier) over fp32 buffers, behind one interface
// that Gloo implements on CPUs and NCCL will implement on GPUs. One Comm per
// rank, used from one thread at a time. A collective whose peers died
// returns an error; the launcher tears the job down anyway.
#pragma once

#include <cstddef>
#include <memory>
#include <string>

#include "base/status.h"

namespace dslaunch::worker {

class Comm {
 public:
  virtual ~Comm() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // Sum over ranks, in place.
  virtual Status AllReduceSum(float* data, size_t n) = 0;
  // `data` holds size() chunks of `chunk` floats; rank r gets the sum of
  // every rank's chunk r in `out`. `data` is the working buffer and is
  // clobbered (no copy of it is made); `out` may be data + rank() * chunk.
  virtual Status ReduceScatterSum(float* data, float* out, size_t chunk) = 0;
  // Every rank's `chunk` floats of `in`, in rank order, into `out`
  // (size() * chunk floats).
  virtual Status AllGather(const float* in, float* out, size_t chunk) = 0;
  virtual Status Broadcast(float* data, size_t n, int root) = 0;
  virtual Status Barrier() = 0;
};

// A world of one rank: every collective is a copy or nothing.
std::unique_ptr<Comm> MakeSingleRankComm();

struct GlooOptions {
  int rank = 0;
  int size = 1;
  std::string store_address;  // DSLAUNCH_STORE
  std::string key_prefix;     // per job attempt, e.g. "<job id>/<restart>/gloo"
  std::string bind_address;   // this rank's address toward its peers
  double timeout_s = 300;
};

// Rendezvous through the launcher's store and connect a full mesh.
StatusOr<std::unique_ptr<Comm>> ConnectGloo(const GlooOptions& options);

// From the rank's environment (RANK, WORLD_SIZE, DSLAUNCH_STORE,
// DSLAUNCH_JOB_ID, TORCHELASTIC_RESTART_COUNT, MASTER_ADDR): a single-rank
// Comm when WORLD_SIZE is 1 or unset, else Gloo.
StatusOr<std::unique_ptr<Comm>> CommFromEnvironment();

}  // namespace dslaunch::worker
