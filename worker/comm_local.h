// LocalWorld: a Comm world of N ranks inside one process, each rank a
// thread, sharing buffers through one mutex; used by tests to run ZeRO and
// the Trainer at several ranks without Gloo or sockets. The test owns the
// LocalWorld (it must outlive every Comm made from it); each Comm is used
// by its own rank's thread, as a Gloo Comm is.
//
// Results are those of comm_gloo.cc: ReduceScatterSum adds in the ring's
// order (chunk c starts at rank c+1 and ends with rank c's own value), so
// it is bit-identical to Gloo at any size. AllReduceSum adds in rank order;
// Gloo's segmented ring adds in an order that depends on n, so the two are
// bit-identical for 1 and 2 ranks (one addition per element) and may differ
// by rounding (a few ulp of the sum) from 3 ranks on. The working buffer of
// ReduceScatterSum is left holding NaN outside `out` (Gloo leaves partial
// sums there): a caller that reads it after the call sees it at once.
//
// A collective that cannot complete (a rank failed, ranks disagree on the
// operation or its size, or the peers did not arrive within the timeout)
// returns Unavailable on every rank in it, and every later collective does
// too: the world is broken, as a Gloo mesh is after a peer's loss.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <vector>

#include "worker/comm.h"

namespace dslaunch::worker {

class LocalWorld {
 public:
  explicit LocalWorld(
      int size, std::chrono::milliseconds timeout = std::chrono::seconds(10));
  ~LocalWorld();
  LocalWorld(const LocalWorld&) = delete;
  LocalWorld& operator=(const LocalWorld&) = delete;

  int size() const { return size_; }
  // The Comm of `rank` (0 <= rank < size); call once per rank.
  std::unique_ptr<Comm> MakeComm(int rank);
  // Rank `rank` fails its `nth` collective (counted from 1 since the world
  // was made) as if its connection dropped: it and its peers get an error.
  void FailAt(int rank, int64_t nth);
  // Collectives each rank has entered (including a failed one).
  int64_t calls(int rank) const;

  // One collective, as a rank's Comm describes it to the world.
  struct Call;

  // Runs every rank of the collective: publishes `call`, waits for every
  // rank, lets `compute` read the other ranks' calls, waits again, then
  // lets `commit` write this rank's output. Used by the Comm.
  Status Run(int rank, const Call& call,
             const std::function<void(const std::vector<Call>&)>& compute,
             const std::function<void()>& commit);

 private:
  // REQUIRES: mu_ held. Waits until every rank has arrived or the world
  // broke.
  Status Arrive(std::unique_lock<std::mutex>& lock, const char* what);
  Status Break(Status st);  // REQUIRES: mu_ held

  const int size_;
  const std::chrono::milliseconds timeout_;
  mutable std::mutex mu_;
  // State below is protected by mu_.
  std::condition_variable cv_;
  int arrived_ = 0;
  uint64_t generation_ = 0;
  Status broken_;
  std::vector<Call> calls_;
  std::vector<int64_t> count_, fail_at_;
};

struct LocalWorld::Call {
  const char* op = "";
  size_t n = 0;  // floats per rank (chunk for the chunked ones)
  int root = 0;
  const float* in = nullptr;
};

// Runs fn(comm) on world.size() threads, one per rank, and returns each
// rank's result; the threads are joined before it returns.
std::vector<Status> RunRanks(LocalWorld& world,
                             const std::function<Status(Comm&)>& fn);

// A Comm that forwards to `comm` without owning it: what a Trainer (which
// owns its Comm) gets inside RunRanks, which owns the world's.
std::unique_ptr<Comm> Borrow(Comm& comm);

}  // namespace dslaunch::worker
