#include "launcher/plan/job_hosts.h"

#include <filesystem>

namespace dslaunch::launcher {

StatusOr<Hostfile> LoadJobHostfile(const std::string& hostfile, int num_gpus) {
  if (!hostfile.empty()) return LoadHostfile(hostfile);
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
  entry.slots = num_gpus > 0 ? num_gpus : gpus > 0 ? gpus : 1;
  local.hosts.push_back(entry);
  return local;
}

StatusOr<JobHosts> LoadJobHosts(const HostsRequest& r, const EnvLookup& env) {
  JobHosts out;
  const bool allocation =
      r.hostfile.empty() &&
      (r.allocation_hosts == AllocationHosts::kAlways ||
       (r.allocation_hosts == AllocationHosts::kWhenInside &&
        InSlurmAllocation(env)));
  if (!allocation) {
    auto hostfile = LoadJobHostfile(r.hostfile, r.num_gpus);
    if (!hostfile.ok()) return hostfile.status();
    out.hostfile = std::move(hostfile).value();
    return out;
  }
  auto read = ReadSlurmAllocation(env, r.num_gpus);
  if (!read.ok()) {
    if (read.status().code() == StatusCode::kNotFound)
      return InvalidArgument("--launcher " + r.mode + ": " +
                             read.status().message());
    return read.status();
  }
  out.hostfile = AllocationHostfile(*read);
  out.from_allocation = true;
  out.said = DescribeAllocation(*read);
  return out;
}

}  // namespace dslaunch::launcher
