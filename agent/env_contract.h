// The environment every rank gets: the torchrun and
// DeepSpeed variables, CUDA_VISIBLE_DEVICES, and dslaunch's own
// DSLAUNCH_JOB_ID / DSLAUNCH_PROGRESS / DSLAUNCH_STORE, laid over the agent's
// environment and the job's --env entries. Pure functions.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "base/status.h"
#include "proto/dslaunch.pb.h"

namespace dslaunch::agent {

struct RankPaths {
  std::string progress_socket;  // DSLAUNCH_PROGRESS
  std::string store_address;    // DSLAUNCH_STORE ("unix:/...")
  std::string error_file;       // TORCHELASTIC_ERROR_FILE
  // The node's interface toward MASTER_ADDR: GLOO_SOCKET_IFNAME and
  // NCCL_SOCKET_IFNAME when neither the agent's environment nor the job's
  // sets them (hostnames resolving to 127.0.1.1 and several NICs otherwise
  // make Gloo/NCCL pick the wrong one). Empty: left alone.
  std::string socket_ifname;
  // The directory of dslaunch's Python files (dslaunch/, dslaunch_hook/):
  // put first on PYTHONPATH, the hook's before the client's. Empty: left
  // alone (no hook, --no_progress_hook).
  std::string python_dir;
  // The node's Horovod rendezvous (HorovodRendezvous) on 127.0.0.1: the
  // HOROVOD_GLOO_RENDEZVOUS_* variables. 0: none.
  int horovod_port = 0;
};

// Horovod's view of the node, as horovodrun gives it: the host name its Gloo
// workers meet under ("local_<host>"), and for the ranks at `local_rank` of
// every node, this node's place among the nodes that have such a rank.
struct CrossPlace {
  int rank = 0;
  int size = 1;
};
std::string HorovodHostname(const wire::JobSpec& job);
CrossPlace HorovodCross(const wire::JobSpec& job, int local_rank);
// The scopes hvd.init() meets in that this node's ranks use, with their
// member counts: "global", "local_<host>", "cross_<local rank>".
std::map<std::string, int> HorovodScopes(const wire::JobSpec& job);

// The contract variables alone, for one rank of `job`: torchrun's,
// DeepSpeed's, Horovod's rank placement (HOROVOD_RANK ... HOROVOD_HOSTNAME,
// and the rendezvous when paths.horovod_port is set) and dslaunch's.
std::map<std::string, std::string> ContractEnv(const wire::JobSpec& job,
                                               const wire::RankSpec& rank,
                                               const RankPaths& paths);

// The rank's whole environment as "K=V" strings: `base` (usually the agent's
// environ) without what the agent's transport set (SSH_CLIENT,
// SSH_CONNECTION, SSH_TTY, SSH_ORIGINAL_COMMAND, SSH_AUTH_SOCK, SHLVL), then
// the job's env entries, then dslaunch's Python directory (python_dir) first
// on PYTHONPATH, then, unless the job or the agent set them, the interface
// (GLOO_SOCKET_IFNAME, NCCL_SOCKET_IFNAME, HOROVOD_GLOO_IFACE) and Horovod's
// Gloo controller (HOROVOD_CONTROLLER and HOROVOD_CPU_OPERATIONS = gloo; not
// for ranks mpirun started, where an MPI-built Horovod uses MPI), then
// (slurm_task_env) the per-task SLURM variables
// (SLURM_PROCID = RANK, SLURM_LOCALID, SLURM_NODEID, SLURM_NTASKS, ...),
// then the contract; later wins. `process_vars`, when given, are the MPI
// runtime's variables of the process mpirun started for this rank (see
// mpi_ranks.h): they replace the base's, after the job's env entries.
std::vector<std::string> BuildRankEnv(
    const wire::JobSpec& job, const wire::RankSpec& rank,
    const RankPaths& paths, const char* const* base,
    const std::vector<std::string>* process_vars = nullptr);

// --bind_cores_to_rank as DeepSpeed shares out cores: each of `ranks` ranks
// gets cores.size() / ranks of them, in order (rank i the i-th block); the
// rest stay unused. InvalidArgument when there is not one core per rank.
StatusOr<std::vector<std::vector<int>>> ShareCores(
    const std::vector<int>& cores, int ranks);

// The rank's argv: the job's argv, with --local_rank=N where the job
// says (before argv[local_rank_at], else at the end) when asked for.
std::vector<std::string> BuildRankArgv(const wire::JobSpec& job,
                                       const wire::RankSpec& rank);

}  // namespace dslaunch::agent
