// The JobSpec each node's agent gets: what every rank of the node runs,
// with which environment, where, and how its agent supervises them. Pure
// function of the plan and what every node's spec shares.
#pragma once

#include <string>
#include <vector>

#include "launcher/plan/job_env.h"
#include "launcher/plan/plan.h"
#include "launcher/plan/rank_command.h"
#include "proto/dslaunch.pb.h"

namespace dslaunch::launcher {

// What every node's JobSpec shares.
struct JobSpecParts {
  std::string job_id;
  EnvList env;  // what every rank gets on top of its agent's environment
  RankCommand command;
  std::string cwd;  // the launcher's working directory
  double kill_grace_s = 5;
  double heartbeat_interval_s = 1;
  double heartbeat_timeout_s = 10;
  bool bind_cores_to_rank = false;
  std::vector<int> bind_cores;
  // Ranks see srun's per-task variables (they are SLURM tasks).
  bool slurm_task_env = false;
  int restart_count = 0;  // the generation
  int max_restarts = 0;
  bool no_progress_hook = false;
};

// node_rank's JobSpec: its ranks (global, local, slot), the world, the
// rendezvous (MASTER_ADDR:MASTER_PORT as `plan` has them now).
wire::JobSpec MakeJobSpec(const Plan& plan, const JobSpecParts& parts,
                          int node_rank);

}  // namespace dslaunch::launcher
