// Ranks that are MPI processes (--launcher openmpi).
//
// mpirun starts one process per rank, `dsagent --from_mpirun`, placed as the
// plan says (--node_slots: each node's slot count, ranks node by node). On
// each node the process of local rank 0 is the node's agent; the others are
// holders: each hands its MPI identity (the OMPI_*, PMIX_*, ... variables
// mpirun gave it) to the agent over an abstract Unix socket named after the
// job and the node, then waits. The agent starts every rank of the node
// itself (process group, cgroup, output, fail-fast as in every mode) with
// the identity of that rank's process, so MPI_Init in the rank joins
// mpirun's world as MPI rank RANK. When the agent ends, it releases the
// holders, which exit 0, and mpirun ends with them.
//
// Both ends check each other: the agent accepts a holder only from our user
// and a sibling (same parent: mpirun's daemon on this node) that proves the
// MPI key; a holder talks only to an agent of our user that is its sibling.
// The MPI key (launcher/start/openmpi_starter.h) is not the secret the agent
// proves to the launcher, and opens nothing once start is over: the agent
// stops listening, and forgets the key, as soon as every holder of its node
// registered, which is before it starts any rank. Bounded: one registration
// of at most kMaxRegistrationBytes per expected holder, a deadline for each.
#pragma once

#include <sys/types.h>

#include <boost/asio/io_context.hpp>
#include <boost/asio/local/stream_protocol.hpp>
#include <boost/asio/steady_timer.hpp>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"

namespace dslaunch::agent {

// Where one process of mpirun's sits in the plan.
struct MpiPlacement {
  int node_rank = 0;
  int local_rank = 0;  // OMPI_COMM_WORLD_LOCAL_RANK
  int local_size = 0;  // OMPI_COMM_WORLD_LOCAL_SIZE
  int world_rank = 0;  // OMPI_COMM_WORLD_RANK
  int first_rank = 0;  // the node's first rank
};

using GetEnv = std::function<const char*(const char*)>;

// The "2,2,4" of --node_slots; InvalidArgument naming the bad entry.
StatusOr<std::vector<int>> ParseNodeSlots(const std::string& csv);

// This process's place, from mpirun's variables, checked against the plan's
// slots: InvalidArgument saying what mpirun did differently.
StatusOr<MpiPlacement> MpiPlacementFrom(const GetEnv& env,
                                        const std::vector<int>& node_slots);

// Whether "NAME=VALUE" is one of the MPI runtime's own variables (OMPI_,
// PMIX_, OPAL_, ORTE_, PRTE_): what a rank takes from its own process.
bool IsMpiVariable(std::string_view entry);
// The MPI runtime's variables of an environment block.
std::vector<std::string> MpiVariables(const char* const* env);

// The abstract socket name of a node's agent: "dslaunch-mpi-" and 32 hex
// digits of an HMAC of the job id and the node's first rank under the MPI
// key. Abstract names have no permissions: one that others could predict,
// they could take first.
std::string MpiSocketName(const std::string& key, const std::string& job_id,
                          int first_rank);

inline constexpr size_t kMaxRegistrationBytes = 256 * 1024;

// The agent's side: collects the node's holders.
class MpiHolders {
 public:
  // `me`: the agent's own placement (local rank 0).
  MpiHolders(boost::asio::io_context& io, std::string job_id, std::string key,
             MpiPlacement me);
  ~MpiHolders();  // releases the holders not released yet

  // Binds the abstract socket and accepts holders until every one has
  // registered (none is expected when local_size is 1: nothing is bound).
  Status Listen();
  // Whether the socket is still open to holders.
  bool listening() const { return acceptor_.is_open(); }
  // Calls `ready` once every holder registered, or after `timeout_s` with
  // why not. Called once.
  void WhenReady(double timeout_s, std::function<void(Status)> ready);
  // The MPI variables of local rank `local_rank`'s process (empty for 0:
  // those are the agent's own).
  const std::vector<std::string>& VariablesOf(int local_rank) const;
  // MPI_COMM_WORLD rank of local rank `local_rank`'s process.
  int WorldRankOf(int local_rank) const;
  // Tells every holder to exit 0 and closes their sockets.
  void Release();
  size_t registered() const { return holders_.size(); }

 private:
  struct Holder;
  void Accept();
  void Refuse(const std::shared_ptr<Holder>& h, const std::string& why);
  void ReadRegistration(const std::shared_ptr<Holder>& h);
  void Register(const std::shared_ptr<Holder>& h, std::string payload);
  void MaybeReady();
  // Every holder registered: closes the socket, refuses any half-way
  // registration and forgets the key.
  void StopListening();

  boost::asio::io_context& io_;
  std::string job_id_;
  std::string key_;
  MpiPlacement me_;
  boost::asio::local::stream_protocol::acceptor acceptor_;
  std::map<int, std::shared_ptr<Holder>> holders_;  // by local rank
  std::vector<std::shared_ptr<Holder>> pending_;    // not registered yet
  std::function<void(Status)> ready_;
  boost::asio::steady_timer ready_timer_;
  boost::asio::steady_timer accept_retry_;  // after an accept error
  int refused_ = 0;
  std::shared_ptr<bool> alive_ = std::make_shared<bool>(true);
};

// The holder's side, for a process with local rank > 0: registers with the
// node's agent (retrying until `timeout_s`) and waits to be released.
// Returns the exit status: 0 when released, 69 when no agent could be
// reached or it went away, 64 when refused.
int RunMpiHolder(const std::string& job_id, const std::string& key,
                 const MpiPlacement& me, double timeout_s);

}  // namespace dslaunch::agent
