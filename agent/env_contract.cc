#include "agent/env_contract.h"

#include <algorithm>  // max

#include "agent/mpi_ranks.h"  // IsMpiVariable
#include "base/host_info.h"   // CpuListString

namespace dslaunch::agent {

static std::string JoinSlots(const wire::JobSpec& job) {
  std::string out;
  for (int slot : job.visible_slots()) {
    if (!out.empty()) out += ",";
    out += std::to_string(slot);
  }
  return out;
}

// What srun --ntasks-per-node=SLOTS would set for this task (the agent's
// own are those of its one-task-per-node step). "" = leave the variable out.
static std::map<std::string, std::string> SlurmTaskEnv(
    const wire::JobSpec& job, const wire::RankSpec& rank) {
  const std::string world = std::to_string(job.world_size());
  std::string gtids;
  for (const auto& r : job.ranks())
    gtids += (gtids.empty() ? "" : ",") + std::to_string(r.rank());
  // Known only when every node has as many ranks as this one.
  std::string per_node;
  if (job.num_nodes() > 0 &&
      job.ranks_size() * job.num_nodes() == job.world_size()) {
    per_node = std::to_string(job.ranks_size());
    if (job.num_nodes() > 1)
      per_node += "(x" + std::to_string(job.num_nodes()) + ")";
  }
  return {
      {"SLURM_PROCID", std::to_string(rank.rank())},
      {"SLURM_LOCALID", std::to_string(rank.local_rank())},
      {"SLURM_NODEID", std::to_string(job.node_rank())},
      {"SLURM_NTASKS", world},
      {"SLURM_NPROCS", world},
      {"SLURM_STEP_NUM_TASKS", world},
      {"SLURM_STEP_NUM_NODES", std::to_string(job.num_nodes())},
      {"SLURM_GTIDS", gtids},
      {"SLURM_NTASKS_PER_NODE",
       per_node.empty() ? "" : std::to_string(job.ranks_size())},
      {"SLURM_TASKS_PER_NODE", per_node},
      {"SLURM_STEP_TASKS_PER_NODE", per_node},
      {"SLURM_TASK_PID", ""},  // the agent's; a rank has its own pid
  };
}

std::string HorovodHostname(const wire::JobSpec& job) {
  return job.host().empty() ? "node" + std::to_string(job.node_rank())
                            : job.host();
}

CrossPlace HorovodCross(const wire::JobSpec& job, int local_rank) {
  // Without the nodes' counts every node is taken to have this one's.
  if (job.node_rank_counts_size() != job.num_nodes())
    return {job.node_rank(), std::max(job.num_nodes(), 1)};
  CrossPlace place{0, 0};
  for (int n = 0; n < job.num_nodes(); ++n) {
    if (job.node_rank_counts(n) <= local_rank) continue;
    if (n < job.node_rank()) ++place.rank;
    ++place.size;
  }
  return place;
}

std::map<std::string, int> HorovodScopes(const wire::JobSpec& job) {
  std::map<std::string, int> scopes{
      {"global", job.world_size()},
      {"local_" + HorovodHostname(job), job.ranks_size()}};
  for (const auto& r : job.ranks()) {
    scopes["cross_" + std::to_string(r.local_rank())] =
        HorovodCross(job, r.local_rank()).size;
  }
  return scopes;
}

std::map<std::string, std::string> ContractEnv(const wire::JobSpec& job,
                                               const wire::RankSpec& rank,
                                               const RankPaths& paths) {
  const std::string local_size = std::to_string(job.ranks_size());
  const std::string node_rank = std::to_string(job.node_rank());
  const std::string num_nodes = std::to_string(job.num_nodes());
  const CrossPlace cross = HorovodCross(job, rank.local_rank());
  std::map<std::string, std::string> env{
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
      {"DSLAUNCH_RESTART_COUNT", std::to_string(job.restart_count())},
      {"TORCHELASTIC_MAX_RESTARTS", std::to_string(job.max_restarts())},
      {"TORCHELASTIC_RUN_ID", job.job_id()},
      {"TORCHELASTIC_ERROR_FILE", paths.error_file},
      {"DSLAUNCH_JOB_ID", job.job_id()},
      {"DSLAUNCH_PROGRESS", paths.progress_socket},
      {"DSLAUNCH_STORE", paths.store_address},
      {"HOROVOD_RANK", std::to_string(rank.rank())},
      {"HOROVOD_SIZE", std::to_string(job.world_size())},
      {"HOROVOD_LOCAL_RANK", std::to_string(rank.local_rank())},
      {"HOROVOD_LOCAL_SIZE", local_size},
      {"HOROVOD_CROSS_RANK", std::to_string(cross.rank)},
      {"HOROVOD_CROSS_SIZE", std::to_string(cross.size)},
      {"HOROVOD_HOSTNAME", HorovodHostname(job)},
  };
  if (paths.horovod_port > 0) {
    env["HOROVOD_GLOO_RENDEZVOUS_ADDR"] = "127.0.0.1";
    env["HOROVOD_GLOO_RENDEZVOUS_PORT"] = std::to_string(paths.horovod_port);
  }
  return env;
}

// What the agent's own transport put into its environment (sshd, the
// remote shell) is nothing of the job's.
static bool IsTransportVariable(const std::string& key) {
  static const char* const kNames[] = {"SSH_CLIENT",    "SSH_CONNECTION",
                                       "SSH_TTY",       "SSH_ORIGINAL_COMMAND",
                                       "SSH_AUTH_SOCK", "SHLVL"};
  for (const char* name : kNames) {
    if (key == name) return true;
  }
  return false;
}

std::vector<std::string> BuildRankEnv(
    const wire::JobSpec& job, const wire::RankSpec& rank,
    const RankPaths& paths, const char* const* base,
    const std::vector<std::string>* process_vars) {
  std::map<std::string, std::string> env;
  for (const char* const* p = base; p && *p; ++p) {
    std::string kv(*p);
    const size_t eq = kv.find('=');
    if (eq == std::string::npos || eq == 0) continue;
    if (process_vars && IsMpiVariable(kv)) continue;  // another process's
    std::string key = kv.substr(0, eq);
    if (IsTransportVariable(key)) continue;
    env[std::move(key)] = kv.substr(eq + 1);
  }
  for (const auto& var : job.env()) env[var.key()] = var.value();
  if (process_vars) {
    for (const auto& kv : *process_vars) {
      const size_t eq = kv.find('=');
      if (eq != std::string::npos && eq > 0)
        env[kv.substr(0, eq)] = kv.substr(eq + 1);
    }
  }
  if (!paths.python_dir.empty()) {
    std::string& path = env["PYTHONPATH"];
    path = paths.python_dir + "/dslaunch_hook:" + paths.python_dir +
           (path.empty() ? "" : ":" + path);
  }
  if (!paths.socket_ifname.empty()) {
    for (const char* key :
         {"GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME", "HOROVOD_GLOO_IFACE"})
      env.try_emplace(key, paths.socket_ifname);
  }
  if (paths.horovod_port > 0 && !process_vars) {
    env.try_emplace("HOROVOD_CONTROLLER", "gloo");
    env.try_emplace("HOROVOD_CPU_OPERATIONS", "gloo");
  }
  if (job.slurm_task_env()) {
    for (auto& [k, v] : SlurmTaskEnv(job, rank)) {
      if (v.empty()) {
        env.erase(k);
      } else {
        env[k] = v;
      }
    }
  }
  for (auto& [k, v] : ContractEnv(job, rank, paths)) env[k] = v;
  std::vector<std::string> out;
  out.reserve(env.size());
  for (const auto& [k, v] : env) out.push_back(k + "=" + v);
  return out;
}

StatusOr<std::vector<std::vector<int>>> ShareCores(
    const std::vector<int>& cores, int ranks) {
  if (ranks <= 0) return std::vector<std::vector<int>>{};
  const size_t each = cores.size() / static_cast<size_t>(ranks);
  if (each == 0) {
    return InvalidArgument(
        "--bind_cores_to_rank: " + std::to_string(cores.size()) + " cores (" +
        base::CpuListString(cores) + ") for " + std::to_string(ranks) +
        " ranks; each rank needs one at least");
  }
  std::vector<std::vector<int>> shares;
  for (int r = 0; r < ranks; ++r) {
    shares.emplace_back(cores.begin() + r * each,
                        cores.begin() + (r + 1) * each);
  }
  return shares;
}

std::vector<std::string> BuildRankArgv(const wire::JobSpec& job,
                                       const wire::RankSpec& rank) {
  std::vector<std::string> argv(job.argv().begin(), job.argv().end());
  if (job.append_local_rank()) {
    std::string flag = "--local_rank=" + std::to_string(rank.local_rank());
    const int at = job.local_rank_at();
    if (at > 0 && static_cast<size_t>(at) <= argv.size()) {
      argv.insert(argv.begin() + at, std::move(flag));
    } else {
      argv.push_back(std::move(flag));
    }
  }
  return argv;
}

}  // namespace dslaunch::agent
