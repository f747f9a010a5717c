#include "worker/gpu/collectives.h"

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <vector>

namespace dslaunch::worker::gpu {
namespace {

// Whether every rank says yes.
StatusOr<bool> Everyone(Comm& comm, bool yes) {
  float no = yes ? 0.0f : 1.0f;
  RETURN_IF_ERROR(comm.AllReduceSum(&no, 1));
  return no == 0.0f;
}

Collectives Gloo(const std::string& why) {
  return {false, "Gloo through host memory (" + why + ")"};
}

}  // namespace

bool NcclForced() {
  const char* env = std::getenv("DSL_NCCL");
  return env != nullptr && std::string(env) == "1";
}

StatusOr<Collectives> ChooseCollectives(Comm& comm, DeviceEngine& dev) {
  const char* env = std::getenv("DSL_NCCL");
  const bool off = env != nullptr && std::string(env) == "0";
  std::string identity, why = "DSL_NCCL=0";
  const bool loads = !off && dev.CollectivesIdentity(&identity);
  if (!off && !loads) why = dev.error();
  // Each rank's GPU by its UUID, as a 64-bit hash: equal ones are shared.
  uint64_t hash = 1469598103934665603ull;  // FNV-1a
  for (char c : identity)
    hash = (hash ^ static_cast<unsigned char>(c)) * 1099511628211ull;
  const int world = comm.size(), rank = comm.rank();
  float mine[3] = {loads ? 1.0f : 0.0f, 0, 0};
  std::memcpy(&mine[1], &hash, sizeof hash);  // bits, not values
  std::vector<float> votes(3 * static_cast<size_t>(world));
  RETURN_IF_ERROR(comm.AllGather(mine, votes.data(), 3));
  std::vector<uint64_t> gpus;
  bool everywhere = true;
  for (int r = 0; r < world; ++r) {
    everywhere = everywhere && votes[3 * r] == 1.0f;
    uint64_t h;
    std::memcpy(&h, &votes[3 * r + 1], sizeof h);
    gpus.push_back(h);
  }
  std::sort(gpus.begin(), gpus.end());
  if (!everywhere) {
    return Gloo(loads ? "NCCL is off or missing on another rank" : why);
  }
  if (std::adjacent_find(gpus.begin(), gpus.end()) != gpus.end())
    return Gloo("ranks share a GPU");
  // Rank 0's unique id to every rank, with whether it made one.
  constexpr size_t kIdFloats = 32;  // NCCL's 128 bytes
  std::vector<float> message(1 + kIdFloats, 0.0f);
  std::string id;
  if (rank == 0 && dev.CollectivesId(&id) &&
      id.size() <= kIdFloats * sizeof(float)) {
    message[0] = 1.0f;
    std::memcpy(&message[1], id.data(), id.size());
  }
  const std::string rank0_error = rank == 0 ? dev.error() : "";
  RETURN_IF_ERROR(comm.Broadcast(message.data(), message.size(), 0));
  if (message[0] != 1.0f) {
    return Gloo("rank 0 could not make an NCCL id" +
                (rank0_error.empty() ? "" : ": " + rank0_error));
  }
  id.assign(reinterpret_cast<const char*>(&message[1]),
            kIdFloats * sizeof(float));
  const char* timeout = std::getenv("DSL_NCCL_TIMEOUT");
  const double timeout_s =
      timeout != nullptr && std::atof(timeout) > 0 ? std::atof(timeout) : 300;
  // Every rank starts joining, and says whether it could, before any
  // waits for the others: one that cannot does not leave the rest
  // waiting out the deadline.
  bool ok = dev.CollectivesJoin(id, rank, world, timeout_s);
  ASSIGN_OR_RETURN(bool all, Everyone(comm, ok));
  if (all) {
    ok = dev.CollectivesWait();
    ASSIGN_OR_RETURN(all, Everyone(comm, ok));
  }
  if (!all) {
    const std::string mine_why = ok ? "" : dev.error();
    dev.CollectivesLeave();
    return Gloo("NCCL's communicator failed " +
                (ok ? std::string("on another rank") : ": " + mine_why));
  }
  return Collectives{true, "NCCL"};
}

}  // namespace dslaunch::worker::gpu
