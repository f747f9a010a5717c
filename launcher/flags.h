// The dslaunch command line (design section 3), parsed with CLI11 into
// LaunchOptions. DeepSpeed's flag names, so existing job scripts keep
// working. Pure; main thread.
#pragma once

#include <string>
#include <vector>

#include "launcher/hostfile.h"
#include "launcher/plan.h"
#include "proto/status.h"

namespace dslaunch::launcher {

struct LaunchOptions {
  std::string hostfile;  // empty = none given
  bool hostfile_given = false;
  PlanOptions plan;
  std::string launcher =
      "auto";                    // auto, local, ssh, pdsh, slurm, openmpi, join
  std::string agent_path;        // empty = this binary's sibling dsagent
  std::vector<std::string> env;  // --env K=V, in order
  std::vector<std::string> env_files;       // --env_file, in order
  std::vector<std::string> export_prefixes;  // --export; empty = defaults
  std::string log_dir;
  double kill_grace_s = 5;
  bool no_local_rank = false;
  bool dry_run = false;
  std::string log_level = "warn";
  double heartbeat_interval_s = 1;
  double heartbeat_timeout_s = 10;
  double start_timeout_s = 60;
  std::string bind_addr = "0.0.0.0";  // where the control server listens
  std::vector<std::string> program;   // PROGRAM ARGS..., byte-exact
};

// Parses argv. Returns the options, or a Status: kInvalidArgument for bad
// usage (exit 64). `--help`/`--version` print and set *exit_now to 0.
StatusOr<LaunchOptions> ParseFlags(int argc, const char* const* argv,
                                   int* exit_now);

// The job's hosts: the named hostfile (missing = error, never a silent local
// run), or without one this machine as "localhost" with one slot per GPU
// (one slot if it has none).
StatusOr<Hostfile> LoadJobHostfile(const LaunchOptions& options);

}  // namespace dslaunch::launcher
