// Which hosts the job runs on, from the options and the environment: a
// hostfile, this machine, or the SLURM allocation the launcher runs in.
#pragma once

#include <string>

#include "launcher/flags.h"
#include "launcher/plan/hostfile.h"
#include "launcher/plan/slurm_allocation.h"
#include "proto/status.h"

namespace dslaunch::launcher {

// The job's hosts: the named hostfile (missing = error, never a silent local
// run), or without one this machine as "localhost" with --num_gpus slots,
// else one per GPU (one if it has none).
StatusOr<Hostfile> LoadJobHostfile(const LaunchOptions& options);

// Where the job's hosts come from (design section 9): inside a SLURM
// allocation with neither --hostfile nor --launcher, the allocation, and
// options->launcher becomes "slurm"; --launcher slurm without a hostfile,
// the allocation too (InvalidArgument outside one), and --launcher openmpi
// without a hostfile inside one; else LoadJobHostfile.
// *said is the one line to show about the choice ("" when there is none).
StatusOr<Hostfile> LoadJobHosts(LaunchOptions* options, const EnvLookup& env,
                                std::string* said);

}  // namespace dslaunch::launcher
