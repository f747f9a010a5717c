// The nodes of a SLURM allocation: read from the
// environment SLURM gives a batch script, an salloc shell or a job step,
// never from a SLURM library. Pure; main thread.
#pragma once

#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"
#include "launcher/plan/hostfile.h"

namespace dslaunch::launcher {

struct SlurmAllocation {
  std::string job_id;              // SLURM_JOB_ID
  std::vector<std::string> nodes;  // SLURM_JOB_NODELIST, expanded, in order
  std::vector<int> slots;          // ranks per node, one entry per node
  std::string slots_from;  // where `slots` came from ("" = 1 by default)
};

using EnvLookup = std::function<std::string(const char* name)>;

// True inside an allocation: SLURM_JOB_ID and a node list are set.
bool InSlurmAllocation(const EnvLookup& env);

// The allocation's nodes and ranks per node: `num_gpus` (--num_gpus, -1 =
// not given), else SLURM_GPUS_ON_NODE (the same on every node), else each
// node's count in SLURM_TASKS_PER_NODE, else 1. DataError naming the
// variable when a value is malformed or missing.
StatusOr<SlurmAllocation> ReadSlurmAllocation(const EnvLookup& env,
                                              int num_gpus);

// SLURM_TASKS_PER_NODE ("4(x2),2": 4, 4, 2) for `nodes` nodes.
StatusOr<std::vector<int>> ParseTasksPerNode(std::string_view text,
                                             size_t nodes);

// The allocation as a hostfile, so that -i/-e/--num_nodes/--num_gpus apply
// to it as to any other (path "SLURM_JOB_NODELIST" in messages).
Hostfile AllocationHostfile(const SlurmAllocation& allocation);

// One line saying what was chosen and from where.
std::string DescribeAllocation(const SlurmAllocation& allocation);

}  // namespace dslaunch::launcher
