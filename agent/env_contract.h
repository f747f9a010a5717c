// The environment every rank gets (design section 5): the torchrun and
// DeepSpeed variables, CUDA_VISIBLE_DEVICES, and dslaunch's own
// DSLAUNCH_JOB_ID / DSLAUNCH_PROGRESS / DSLAUNCH_STORE, laid over the agent's
// environment and the job's --env entries. Pure functions.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "proto/dslaunch.pb.h"

namespace dslaunch::agent {

struct RankPaths {
  std::string progress_socket;  // DSLAUNCH_PROGRESS
  std::string store_address;    // DSLAUNCH_STORE ("unix:/...")
  std::string error_file;       // TORCHELASTIC_ERROR_FILE
};

// The contract variables alone, for one rank of `job`.
std::map<std::string, std::string> ContractEnv(const wire::JobSpec& job,
                                               const wire::RankSpec& rank,
                                               const RankPaths& paths);

// The rank's whole environment as "K=V" strings: `base` (usually the agent's
// environ), then the job's env entries, then the contract; later wins.
std::vector<std::string> BuildRankEnv(const wire::JobSpec& job,
                                      const wire::RankSpec& rank,
                                      const RankPaths& paths,
                                      const char* const* base);

// The rank's argv: the job's argv, plus --local_rank=N when asked for.
std::vector<std::string> BuildRankArgv(const wire::JobSpec& job,
                                       const wire::RankSpec& rank);

}  // namespace dslaunch::agent
