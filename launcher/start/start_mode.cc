// The start modes: the one table a new mode is added to.
#include "launcher/start/start_mode.h"

#include "launcher/start/starter.h"

namespace dslaunch::launcher {

namespace {

StartMode Auto() {
  StartMode m{"auto", nullptr};
  m.allocation_hosts = AllocationHosts::kWhenInside;
  m.in_allocation_becomes = "slurm";
  m.over_allocation = "inside the allocation: --launcher slurm";
  return m;
}

StartMode Pdsh() {
  StartMode m{"pdsh", NewPdshStarter};
  m.tool_args = true;
  return m;
}

StartMode Slurm() {
  StartMode m{"slurm", NewSlurmStarter};
  m.tool_args = true;
  m.allocation_hosts = AllocationHosts::kAlways;
  m.ranks_are_slurm_tasks = true;
  m.scheduler_signals_agents = true;
  return m;
}

StartMode OpenMpi() {
  StartMode m{"openmpi", NewOpenMpiStarter};
  m.tool_args = true;
  // mpirun inside an allocation runs over it, as srun would; its daemons
  // are SLURM tasks, one per node.
  m.allocation_hosts = AllocationHosts::kWhenInside;
  m.ranks_are_slurm_tasks_in_allocation = true;
  m.over_allocation = "mpirun runs over the allocation";
  m.each_generation_starts = "a new mpirun";
  return m;
}

StartMode Join() {
  StartMode m{"join", NewJoinStarter};
  m.agents_join = true;
  return m;
}

const std::vector<StartMode>& Modes() {
  static const std::vector<StartMode> modes = {
      Auto(),
      {"local", NewLocalStarter},
      {"ssh", NewSshStarter},
      Pdsh(),
      Slurm(),
      OpenMpi(),
      Join(),
  };
  return modes;
}

}  // namespace

const StartMode* FindStartMode(std::string_view name) {
  for (const auto& m : Modes()) {
    if (name == m.name) return &m;
  }
  return nullptr;
}

const StartMode& StartModeNamed(std::string_view name) {
  const StartMode* m = FindStartMode(name);
  return m ? *m : Modes().front();  // unreachable after ParseFlags
}

std::vector<std::string> StartModeNames() {
  std::vector<std::string> names;
  for (const auto& m : Modes()) names.emplace_back(m.name);
  return names;
}

}  // namespace dslaunch::launcher
