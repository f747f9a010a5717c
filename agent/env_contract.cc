#include "agent/env_contract.h"

namespace dslaunch::agent {

static std::string JoinSlots(const wire::JobSpec& job) {
  std::string out;
  for (int slot : job.visible_slots()) {
    if (!out.empty()) out += ",";
    out += std::to_string(slot);
  }
  return out;
}

std::map<std::string, std::string> ContractEnv(const wire::JobSpec& job,
                                               const wire::RankSpec& rank,
                                               const RankPaths& paths) {
  const std::string local_size = std::to_string(job.ranks_size());
  const std::string node_rank = std::to_string(job.node_rank());
  const std::string num_nodes = std::to_string(job.num_nodes());
  return {
      {"RANK", std::to_string(rank.rank())},
      {"LOCAL_RANK", std::to_string(rank.local_rank())},
      {"WORLD_SIZE", std::to_string(job.world_size())},
      {"LOCAL_WORLD_SIZE", local_size},
      {"LOCAL_SIZE", local_size},
      {"NODE_RANK", node_rank},
      {"GROUP_RANK", node_rank},
      {"GROUP_WORLD_SIZE", num_nodes},
      {"ROLE_RANK", std::to_string(rank.rank())},
      {"ROLE_WORLD_SIZE", std::to_string(job.world_size())},
      {"ROLE_NAME", "default"},
      {"CROSS_RANK", node_rank},
      {"CROSS_SIZE", num_nodes},
      {"MASTER_ADDR", job.master_addr()},
      {"MASTER_PORT", std::to_string(job.master_port())},
      {"CUDA_VISIBLE_DEVICES", JoinSlots(job)},
      {"PYTHONUNBUFFERED", "1"},
      {"TORCHELASTIC_RESTART_COUNT", std::to_string(job.restart_count())},
      {"TORCHELASTIC_MAX_RESTARTS", "0"},
      {"TORCHELASTIC_RUN_ID", job.job_id()},
      {"TORCHELASTIC_ERROR_FILE", paths.error_file},
      {"DSLAUNCH_JOB_ID", job.job_id()},
      {"DSLAUNCH_PROGRESS", paths.progress_socket},
      {"DSLAUNCH_STORE", paths.store_address},
  };
}

std::vector<std::string> BuildRankEnv(const wire::JobSpec& job,
                                      const wire::RankSpec& rank,
                                      const RankPaths& paths,
                                      const char* const* base) {
  std::map<std::string, std::string> env;
  for (const char* const* p = base; p && *p; ++p) {
    std::string kv(*p);
    const size_t eq = kv.find('=');
    if (eq == std::string::npos || eq == 0) continue;
    env[kv.substr(0, eq)] = kv.substr(eq + 1);
  }
  for (const auto& var : job.env()) env[var.key()] = var.value();
  for (auto& [k, v] : ContractEnv(job, rank, paths)) env[k] = v;
  std::vector<std::string> out;
  out.reserve(env.size());
  for (const auto& [k, v] : env) out.push_back(k + "=" + v);
  return out;
}

std::vector<std::string> BuildRankArgv(const wire::JobSpec& job,
                                       const wire::RankSpec& rank) {
  std::vector<std::string> argv(job.argv().begin(), job.argv().end());
  if (job.append_local_rank()) {
    argv.push_back("--local_rank=" + std::to_string(rank.local_rank()));
  }
  return argv;
}

}  // namespace dslaunch::agent
