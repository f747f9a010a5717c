#include "launcher/job_hosts.h"

#include <filesystem>

namespace dslaunch::launcher {

StatusOr<Hostfile> LoadJobHostfile(const LaunchOptions& options) {
  if (options.hostfile_given) return LoadHostfile(options.hostfile);
  int gpus = 0;
  std::error_code ec;
  for (auto it =
           std::filesystem::directory_iterator("/proc/driver/nvidia/gpus", ec);
       !ec && it != std::filesystem::directory_iterator(); it.increment(ec)) {
    ++gpus;
  }
  Hostfile local;
  HostEntry entry;
  entry.host = "localhost";
  // --num_gpus N: N ranks here, also without (as many) GPUs, as DeepSpeed.
  entry.slots = options.plan.num_gpus > 0 ? options.plan.num_gpus
                : gpus > 0                ? gpus
                                          : 1;
  local.hosts.push_back(entry);
  return local;
}

StatusOr<Hostfile> LoadJobHosts(LaunchOptions* o, const EnvLookup& env,
                                std::string* said) {
  said->clear();
  const bool auto_slurm =
      o->launcher == "auto" && !o->hostfile_given && InSlurmAllocation(env);
  // mpirun inside an allocation runs over it, as srun would.
  const bool mpirun_in_allocation =
      o->launcher == "openmpi" && !o->hostfile_given && InSlurmAllocation(env);
  if (!auto_slurm && !mpirun_in_allocation &&
      (o->launcher != "slurm" || o->hostfile_given))
    return LoadJobHostfile(*o);
  auto allocation = ReadSlurmAllocation(env, o->plan.num_gpus);
  if (!allocation.ok()) {
    if (allocation.status().code() == StatusCode::kNotFound)
      return InvalidArgument("--launcher slurm: " +
                             allocation.status().message());
    return allocation.status();
  }
  if (auto_slurm) o->launcher = "slurm";
  o->hosts_from_slurm = true;
  *said = DescribeAllocation(*allocation) +
          (auto_slurm             ? " (inside the allocation: --launcher slurm)"
           : mpirun_in_allocation ? " (mpirun runs over the allocation)"
                                  : "");
  return AllocationHostfile(*allocation);
}

}  // namespace dslaunch::launcher
