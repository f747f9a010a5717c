// Which hosts the job runs on: a hostfile, this machine, or the SLURM
// allocation the launcher runs in.
#pragma once

#include <string>

#include "base/status.h"
#include "launcher/plan/hostfile.h"
#include "launcher/plan/slurm_allocation.h"

namespace dslaunch::launcher {

// Where a start mode's nodes come from when no hostfile is given.
enum class AllocationHosts {
  kNever,       // this machine alone
  kWhenInside,  // a SLURM allocation's nodes when run inside one
  kAlways,      // a SLURM allocation's, else an error
};

struct HostsRequest {
  std::string hostfile;  // empty: none given
  int num_gpus = 0;      // --num_gpus; 0 = not given
  AllocationHosts allocation_hosts = AllocationHosts::kNever;
  std::string mode;  // the start mode's name, for messages
};

struct JobHosts {
  Hostfile hostfile;
  bool from_allocation = false;
  std::string said;  // the one line to show about the choice, or ""
};

// The named hostfile (missing = error, never a silent local run), or
// without one this machine as "localhost" with --num_gpus slots, else one
// per GPU (one if it has none).
StatusOr<Hostfile> LoadJobHostfile(const std::string& hostfile, int num_gpus);

// The job's hosts: without a hostfile, the allocation when the mode takes
// one (kAlways: InvalidArgument outside one), else LoadJobHostfile.
StatusOr<JobHosts> LoadJobHosts(const HostsRequest& request,
                                const EnvLookup& env);

}  // namespace dslaunch::launcher
