// LaunchOptions: what the dslaunch command line asks for (flags.h parses
// it), read by every stage after the plan. Plain values.
#pragma once

#include <string>
#include <vector>

#include "launcher/plan/hostfile.h"
#include "launcher/plan/plan.h"

namespace dslaunch::launcher {

// Bounds of the numeric flags (documented in docs/decisions.md); values
// outside them, nan and inf are usage errors naming the flag.
inline constexpr double kMaxKillGraceSeconds = 3600;
inline constexpr double kMinHeartbeatIntervalSeconds = 0.01;
inline constexpr double kMaxHeartbeatSeconds = 3600;
inline constexpr double kMaxStartSeconds = 86400;
inline constexpr int kJoinControlPort = 29400;
inline constexpr double kMaxSshTimeoutSeconds = 3600;
inline constexpr int kMaxSshFanout = 1024;
inline constexpr double kMaxHangSeconds = 7 * 86400;
inline constexpr int kMaxRestarts = 10000;
inline constexpr double kMaxRestartBackoffSeconds = 3600;

struct LaunchOptions {
  std::string hostfile;  // empty = none given
  bool hostfile_given = false;
  bool hosts_from_slurm = false;  // the nodes are a SLURM allocation's
  PlanOptions plan;
  std::string num_nodes_text;  // --num_nodes as given: N or MIN:MAX
  std::string launcher =
      "auto";                    // auto, local, ssh, pdsh, slurm, openmpi, join
  std::string agent_path;        // empty = this binary's sibling dsagent
  std::vector<std::string> env;  // --env K=V, in order
  std::vector<std::string> env_files;        // --env_file, in order
  std::vector<std::string> export_prefixes;  // --export; empty = defaults
  bool master_port_given = false;            // else a free port on node 0
  std::string log_dir;
  double kill_grace_s = 5;
  // Restarts (torchrun's --max_restarts): a failed generation is followed by
  // another, on the same agents, up to max_restarts times, each after
  // restart_backoff_s.
  int max_restarts = 0;
  double restart_backoff_s = 1;
  // A lost node's agent is started again for the next generation, which
  // waits rejoin_timeout_s for it; a node lost twice within
  // node_cooldown_s is excluded for that long.
  double rejoin_timeout_s = 300;
  double node_cooldown_s = 600;
  // --num_nodes MIN:MAX: a generation starts on MAX healthy nodes, or on at
  // least MIN once no further node became ready for join_settle_s.
  double join_settle_s = 10;
  bool no_local_rank = false;
  // DeepSpeed's launcher flags, with DeepSpeed's meaning: its job scripts
  // run unchanged.
  bool no_python = false;     // run PROGRAM as given, never via python
  bool module = false;        // -m: PYTHON -u -m PROGRAM
  std::string launcher_args;  // --launcher_args as given
  std::vector<std::string> launcher_words;  // ... split as sh would
  bool no_ssh_check = false;                // skip the reachability preflight
  bool force_multi = false;       // one local node still starts over ssh
  bool save_pid = false;          // /tmp/<pid>.deepspeed while we run
  std::string each_rank_log_dir;  // --enable_each_rank_log DIR
  bool bind_cores_to_rank = false;
  bool no_progress_hook = false;  // --no_progress_hook
  std::string bind_core_list;     // "1,3-5,7"; empty = the node's cores
  std::vector<int> bind_cores;    // ... parsed
  bool dry_run = false;
  std::string log_level = "warn";
  double heartbeat_interval_s = 1;
  double heartbeat_timeout_s = 10;
  double start_timeout_s = 60;
  std::string bind_addr;     // where the control server listens; empty = chosen
  std::string control_addr;  // what agents dial; empty = the route to each node
  // --launcher join: the control server listens on --control_addr (default
  // 0.0.0.0) port --control_port (default 29400) and waits --join_timeout
  // for --num_nodes agents that prove the secret in --secret_file.
  int control_port = 0;  // 0: any free port (join: 29400)
  std::string secret_file;
  double join_timeout_s = 600;
  // SSH (the ssh starter); port 0 and empty strings mean libssh's defaults.
  int ssh_port = 0;
  std::string ssh_user;
  std::string ssh_identity;
  std::string ssh_known_hosts;
  std::string ssh_config;
  std::string ssh_host_key_check = "strict";
  int ssh_fanout = 32;
  double ssh_timeout_s = 10;
  // Watching the job (docs/observability.md): what the terminal shows
  // (auto = table on a terminal, lines otherwise; table, all = a row per
  // rank, lines, rank0, none), TensorBoard event files, the Prometheus
  // endpoint (port 0 = none), hang and straggler checks.
  std::string console = "auto";
  bool no_fold = false;  // every rank's line on its own, even when identical
  std::string tensorboard_dir;
  int metrics_port = 0;
  // --metrics_addr; empty: the addresses the control server listens on.
  std::string metrics_addr;
  double hang_timeout_s = 0;  // 0 = no hang check
  std::string on_hang = "warn";
  double straggler_k = 5;  // step time > median + k * MAD; 0 = no check
  bool doctor = false;     // `dslaunch doctor`: the preflight alone
  std::vector<std::string> program;  // PROGRAM ARGS..., byte-exact
};

}  // namespace dslaunch::launcher
