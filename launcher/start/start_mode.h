// StartMode: what the rest of the launcher may know of a start mode (how
// agents start: local, ssh, pdsh, slurm, openmpi, join). Code outside start/
// asks these traits and never compares a mode's name; a new mode is a starter
// file, its tests and one line of the table in start_mode.cc.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "launcher/plan/job_hosts.h"  // AllocationHosts

namespace dslaunch::launcher {

class Starter;
struct StarterContext;

struct StartMode {
  const char* name;
  // Null for `auto`, which ResolveStartMode turns into a real mode.
  std::unique_ptr<Starter> (*make)(const StarterContext&);
  // The nodes are the agents that come to the launcher (join): no hostfile,
  // the plan is made from what they report.
  bool agents_join = false;
  // --launcher_args are passed to the mode's tool (pdsh, srun, mpirun).
  bool tool_args = false;
  // Where its nodes come from when no hostfile is given.
  AllocationHosts allocation_hosts = AllocationHosts::kNever;
  // Over an allocation's nodes the job runs as this mode (auto: slurm);
  // null = as itself. `over_allocation` is said with the allocation.
  const char* in_allocation_becomes = nullptr;
  const char* over_allocation = nullptr;
  // Every rank is a SLURM task (srun's per-task variables), always (slurm)
  // or when the nodes are an allocation's (openmpi: its daemons are tasks).
  bool ranks_are_slurm_tasks = false;
  bool ranks_are_slurm_tasks_in_allocation = false;
  // A signal to an agent from outside is the scheduler ending the step.
  bool scheduler_signals_agents = false;
  // Null: its agents wait, connected, between generations (--max_restarts).
  // Else every generation runs on new agents, all started at once by this
  // ("a new mpirun": an MPI job's processes cannot start ranks twice).
  const char* each_generation_starts = nullptr;

  bool RanksAreSlurmTasks(bool hosts_from_allocation) const {
    return ranks_are_slurm_tasks ||
           (hosts_from_allocation && ranks_are_slurm_tasks_in_allocation);
  }
};

// The mode named `name` (auto included), or null.
const StartMode* FindStartMode(std::string_view name);
// The mode named `name`, which ParseFlags has checked exists.
const StartMode& StartModeNamed(std::string_view name);
// Every name --launcher takes, `auto` first.
std::vector<std::string> StartModeNames();

}  // namespace dslaunch::launcher
