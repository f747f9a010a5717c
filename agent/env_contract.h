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
};

// The contract variables alone, for one rank of `job`.
std::map<std::string, std::string> ContractEnv(const wire::JobSpec& job,
                                               const wire::RankSpec& rank,
                                               const RankPaths& paths);

// The rank's whole environment as "K=V" strings: `base` (usually the agent's
// environ) without what the agent's transport set (SSH_CLIENT,
// SSH_CONNECTION, SSH_TTY, SSH_ORIGINAL_COMMAND, SSH_AUTH_SOCK, SHLVL), then
// the job's env entries, then dslaunch's Python directory (python_dir) first
// on PYTHONPATH, then (slurm_task_env) the per-task SLURM variables
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
