#include "launcher/plan/job_spec.h"

#include <algorithm>  // max

namespace dslaunch::launcher {

wire::JobSpec MakeJobSpec(const Plan& plan, const JobSpecParts& parts,
                          int node_rank) {
  const NodePlan& node = plan.nodes.at(node_rank);
  wire::JobSpec job;
  job.set_job_id(parts.job_id);
  for (const auto& a : parts.command.argv) job.add_argv(a);
  for (const auto& [key, value] : parts.env) {
    auto* var = job.add_env();
    var->set_key(key);
    var->set_value(value);
  }
  job.set_cwd(parts.cwd);
  for (size_t i = 0; i < node.slots.size(); ++i) {
    auto* r = job.add_ranks();
    r->set_rank(node.first_rank + static_cast<int>(i));
    r->set_local_rank(static_cast<int>(i));
    r->set_slot(node.slots[i]);
    job.add_visible_slots(node.slots[i]);
  }
  job.set_node_rank(node_rank);
  job.set_num_nodes(static_cast<int>(plan.nodes.size()));
  for (const NodePlan& n : plan.nodes)
    job.add_node_rank_counts(static_cast<int>(n.slots.size()));
  job.set_world_size(plan.world_size);
  job.set_master_addr(plan.master_addr);
  job.set_master_port(plan.master_port);
  job.set_kill_grace_s(parts.kill_grace_s);
  job.set_heartbeat_interval_s(parts.heartbeat_interval_s);
  job.set_heartbeat_timeout_s(parts.heartbeat_timeout_s);
  job.set_append_local_rank(parts.command.local_rank_at >= 0);
  job.set_local_rank_at(std::max(parts.command.local_rank_at, 0));
  job.set_bind_cores_to_rank(parts.bind_cores_to_rank);
  job.set_slurm_task_env(parts.slurm_task_env);
  for (int core : parts.bind_cores) job.add_bind_core_list(core);
  job.set_host(node.host);
  job.set_restart_count(parts.restart_count);
  job.set_max_restarts(parts.max_restarts);
  job.set_no_progress_hook(parts.no_progress_hook);
  return job;
}

}  // namespace dslaunch::launcher
