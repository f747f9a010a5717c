#include "launcher/flags.h"

#include <CLI/CLI.hpp>
#include <algorithm>  // max
#include <cmath>      // isfinite
#include <cstdio>
#include <string_view>

#include "base/host_info.h"  // ParseCpuList
#include "launcher/shell_words.h"
#include "launcher/start/start_mode.h"
#include "proto/version.h"

namespace dslaunch::launcher {

static void AddOptions(CLI::App& app, LaunchOptions& o) {
  app.add_option("-H,--hostfile", o.hostfile,
                 "hostfile: 'host slots=N [port=P] [user=U]' per line");
  app.add_option("-i,--include", o.plan.include,
                 "use only these hosts/slots: host[:slot,slot][@host...]");
  app.add_option("-e,--exclude", o.plan.exclude,
                 "leave out these hosts/slots: host[:slot,slot][@host...]");
  app.add_option("--num_nodes", o.num_nodes_text,
                 "use the first N hosts; MIN:MAX: a generation runs on MIN "
                 "to MAX of them, the hosts beyond MAX are spares "
                 "(needs --max_restarts)");
  app.add_option("--num_gpus,--num_accelerators", o.plan.num_gpus,
                 "use the first N slots per host (no hostfile: N ranks here)");
  app.add_option("--master_addr", o.plan.master_addr,
                 "rendezvous address for the ranks (default: node 0)");
  app.add_option(
      "--master_port", o.plan.master_port,
      "rendezvous port for the ranks (default: a free port on node 0)");
  app.add_option("--launcher", o.launcher,
                 "how agents start: local, ssh, pdsh, slurm, openmpi, join")
      ->check(CLI::IsMember(StartModeNames()));
  app.add_option("--agent_path", o.agent_path,
                 "dsagent on the nodes (default: next to dslaunch)");
  app.add_option("--env", o.env, "K=V for every rank (repeatable)")
      ->allow_extra_args(false);
  app.add_option("--env_file", o.env_files,
                 "KEY=VALUE lines for every rank (repeatable)")
      ->allow_extra_args(false);
  app.add_option(
         "--export", o.export_prefixes,
         "export launcher variables with this prefix (repeatable; "
         "default NCCL_ GLOO_ PYTHON UCX_ OMP_ CUDA LD_LIBRARY_PATH ...)")
      ->allow_extra_args(false);
  app.add_option("--log_dir", o.log_dir,
                 "write rank-<r>.log and metrics.jsonl here");
  app.add_option("--kill_grace", o.kill_grace_s,
                 "seconds from SIGTERM to SIGKILL on abort (default 5)");
  app.add_option("--max_restarts", o.max_restarts,
                 "start the job again after a failure, at most this many "
                 "times, on the same agents (default 0)");
  app.add_option("--restart_backoff", o.restart_backoff_s,
                 "seconds between a failed generation and the next "
                 "(default 1)");
  app.add_option("--rejoin_timeout", o.rejoin_timeout_s,
                 "seconds the next generation waits for lost nodes to come "
                 "back before the job ends with 69 (default 300)");
  app.add_option("--join_settle", o.join_settle_s,
                 "--num_nodes MIN:MAX: start a generation on fewer than MAX "
                 "nodes once no further one came for this many seconds "
                 "(default 10)");
  app.add_option("--node_cooldown", o.node_cooldown_s,
                 "a node lost twice within this many seconds is left out for "
                 "as long (default 600)");
  app.add_flag("--no_local_rank", o.no_local_rank,
               "do not pass --local_rank=N to the program");
  app.add_flag("--no_python", o.no_python,
               "run PROGRAM as it is, also when it is a .py script");
  app.add_flag("-m,--module", o.module,
               "run PROGRAM as a Python module (python -u -m PROGRAM)");
  app.add_option("--launcher_args", o.launcher_args,
                 "arguments appended to pdsh, srun or mpirun");
  app.add_flag("--no_ssh_check", o.no_ssh_check,
               "skip the check that every node answers before the start");
  app.add_flag("--force_multi", o.force_multi,
               "start over ssh even when every node is this machine");
  app.add_flag("--save_pid", o.save_pid,
               "write our pid to /tmp/<pid>.deepspeed while the job runs");
  app.add_option("--enable_each_rank_log", o.each_rank_log_dir,
                 "write each rank's output to DIR/<time>_rank<N>.log "
                 "instead of the console");
  app.add_flag("--bind_cores_to_rank", o.bind_cores_to_rank,
               "bind each rank to its share of the node's cores");
  app.add_flag("--no_progress_hook", o.no_progress_hook,
               "Python ranks do not get the hook that reports DeepSpeed's "
               "and the Hugging Face Trainer's progress");
  app.add_option("--bind_core_list", o.bind_core_list,
                 "cores to share out with --bind_cores_to_rank, e.g. "
                 "1,3-5,7 (default: the node's cores)");
  app.add_flag("--dry-run,--dry_run", o.dry_run,
               "print the rank plan and exit");
  app.add_option("--log_level", o.log_level,
                 "launcher and agent logging: debug, info, warn, error")
      ->check(CLI::IsMember(
          {"trace", "debug", "info", "warn", "error", "critical", "off"}));
  app.add_option("--ssh_port", o.ssh_port, "SSH port (hostfile port= wins)");
  app.add_option("--ssh_user", o.ssh_user, "SSH user (hostfile user= wins)");
  app.add_option("--ssh_identity", o.ssh_identity,
                 "SSH private key (default: your keys and ssh-agent)");
  app.add_option("--ssh_known_hosts", o.ssh_known_hosts,
                 "known_hosts file (default ~/.ssh/known_hosts)");
  app.add_option("--ssh_config", o.ssh_config,
                 "ssh config file (default ~/.ssh/config)");
  app.add_option("--ssh_host_key_check", o.ssh_host_key_check,
                 "strict (default), accept-new or off")
      ->check(CLI::IsMember({"strict", "accept-new", "off"}));
  app.add_option("--ssh_fanout", o.ssh_fanout,
                 "SSH connections opened at once (default 32)");
  app.add_option("--ssh_timeout", o.ssh_timeout_s,
                 "seconds for each SSH connect and check (default 10)");
  app.add_option(
      "--control_addr", o.control_addr,
      "address agents dial back to (default: the route to each node)");
  app.add_option("--heartbeat_interval", o.heartbeat_interval_s,
                 "seconds between heartbeats (default 1)");
  app.add_option(
      "--heartbeat_timeout", o.heartbeat_timeout_s,
      "seconds without heartbeat before a peer counts as lost (default 10)");
  app.add_option("--start_timeout", o.start_timeout_s,
                 "seconds for every agent to connect (default 60)");
  app.add_option("--control_port", o.control_port,
                 "port of the control server (default: any; join: 29400)");
  app.add_option("--secret_file", o.secret_file,
                 "join: the file holding the job secret (e.g. a mounted "
                 "Kubernetes Secret), which every joining agent must prove");
  app.add_option("--join_timeout", o.join_timeout_s,
                 "join: seconds to wait for --num_nodes agents (default 600)");
  app.add_option("--console", o.console,
                 "what the terminal shows: table (a live row per node), all "
                 "(a row per rank), lines, rank0, none (default: table on a "
                 "terminal, else lines)")
      ->check(
          CLI::IsMember({"auto", "table", "all", "lines", "rank0", "none"}));
  app.add_flag("--no_fold", o.no_fold,
               "show identical lines of several ranks each on its own "
               "instead of once as [host:0-7]");
  app.add_option("--tensorboard", o.tensorboard_dir,
                 "write TensorBoard event files of every rank's progress "
                 "records here");
  app.add_option("--metrics_port", o.metrics_port,
                 "serve Prometheus metrics on this port (default: none)");
  app.add_option("--metrics_addr", o.metrics_addr,
                 "address of the metrics endpoint (default: the addresses the "
                 "control server listens on; 0.0.0.0 for all)");
  app.add_option("--hang_timeout", o.hang_timeout_s,
                 "name a running rank without a progress record for this "
                 "many seconds and collect its stacks (default: no check)");
  app.add_option("--on_hang", o.on_hang,
                 "what a hang does: warn, or abort the job (default warn)")
      ->check(CLI::IsMember({"warn", "abort"}));
  app.add_option("--straggler_k", o.straggler_k,
                 "warn when a rank's step time exceeds the median by k "
                 "median absolute deviations (default 5; 0: never)");
}

namespace {

// DeepSpeed's flags that dslaunch does not do: taken (so that they are never
// read as PROGRAM) and refused with a reason.
struct RefusedFlag {
  const char* name;
  bool takes_value;
  const char* why;
};
constexpr RefusedFlag kRefusedFlags[] = {
    {"--elastic_training", false,
     "elastic training is not supported yet; run with a fixed set of nodes"},
    {"--min_elastic_nodes", true,
     "elastic training is not supported yet; run with a fixed set of nodes"},
    {"--max_elastic_nodes", true,
     "elastic training is not supported yet; run with a fixed set of nodes"},
    {"--autotuning", true,
     "DeepSpeed's autotuner is not supported; find the configuration with "
     "`deepspeed --autotuning tune`, then launch it with dslaunch"},
};

void AddRefusedFlags(CLI::App& app) {
  for (const RefusedFlag& f : kRefusedFlags) {
    if (f.takes_value) {
      app.add_option(f.name)->group("");  // hidden from --help
    } else {
      app.add_flag(f.name)->group("");
    }
  }
}

Status CheckRefusedFlags(const CLI::App& app) {
  for (const RefusedFlag& f : kRefusedFlags) {
    if (app.count(f.name) > 0)
      return InvalidArgument(std::string(f.name) + ": " + f.why);
  }
  return Status::Ok();
}

std::string FormatNumber(double value) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%g", value);
  return buf;
}

// A duration flag: finite, above `min` (or at it when min_inclusive), at
// most `max` (nan, inf and absurd values would break the timers).
struct SecondsFlag {
  const char* flag;
  double value;
  double min;
  bool min_inclusive;
  double max;
};

Status CheckSeconds(const SecondsFlag& f) {
  const bool low_ok = f.min_inclusive ? f.value >= f.min : f.value > f.min;
  if (std::isfinite(f.value) && low_ok && f.value <= f.max) return Status::Ok();
  return InvalidArgument(
      std::string(f.flag) + " must be a number of seconds in " +
      (f.min_inclusive ? "[" : "(") + FormatNumber(f.min) + ", " +
      FormatNumber(f.max) + "], got " + FormatNumber(f.value));
}

Status CheckDurations(const LaunchOptions& o) {
  const SecondsFlag flags[] = {
      {"--kill_grace", o.kill_grace_s, 0, true, kMaxKillGraceSeconds},
      {"--heartbeat_interval", o.heartbeat_interval_s,
       kMinHeartbeatIntervalSeconds, true, kMaxHeartbeatSeconds},
      {"--heartbeat_timeout", o.heartbeat_timeout_s, 0, false,
       kMaxHeartbeatSeconds},
      {"--start_timeout", o.start_timeout_s, 0, false, kMaxStartSeconds},
      {"--join_timeout", o.join_timeout_s, 0, false, kMaxStartSeconds},
      {"--ssh_timeout", o.ssh_timeout_s, 0, false, kMaxSshTimeoutSeconds},
      {"--hang_timeout", o.hang_timeout_s, 0, true, kMaxHangSeconds},
      {"--restart_backoff", o.restart_backoff_s, 0, true,
       kMaxRestartBackoffSeconds},
      {"--rejoin_timeout", o.rejoin_timeout_s, 0, true, kMaxStartSeconds},
      {"--node_cooldown", o.node_cooldown_s, 0, true, kMaxHangSeconds},
      {"--join_settle", o.join_settle_s, 0, true, kMaxStartSeconds},
  };
  for (const SecondsFlag& f : flags) RETURN_IF_ERROR(CheckSeconds(f));
  if (!(o.straggler_k >= 0 && o.straggler_k <= 1000))
    return InvalidArgument("--straggler_k must be a number in [0, 1000], got " +
                           FormatNumber(o.straggler_k));
  if (o.heartbeat_timeout_s <= o.heartbeat_interval_s) {
    return InvalidArgument(
        "--heartbeat_timeout must be greater than --heartbeat_interval, got " +
        FormatNumber(o.heartbeat_timeout_s) +
        " <= " + FormatNumber(o.heartbeat_interval_s));
  }
  return Status::Ok();
}

// An integer flag checked only when given (its default means "all" or
// "libssh's default"): then it must be in [min, max].
Status CheckGivenInt(const CLI::App& app, const char* flag, int value, int min,
                     int max) {
  if (app.count(flag) == 0 || (value >= min && value <= max))
    return Status::Ok();
  return InvalidArgument(std::string(flag) + " must be in " +
                         std::to_string(min) + ".." + std::to_string(max) +
                         ", got " + std::to_string(value));
}

Status CheckIntegers(const CLI::App& app, const LaunchOptions& o) {
  RETURN_IF_ERROR(
      CheckGivenInt(app, "--num_gpus", o.plan.num_gpus, 1, kMaxSlotsPerHost));
  RETURN_IF_ERROR(
      CheckGivenInt(app, "--master_port", o.plan.master_port, 1, 65535));
  RETURN_IF_ERROR(CheckGivenInt(app, "--ssh_port", o.ssh_port, 1, 65535));
  RETURN_IF_ERROR(
      CheckGivenInt(app, "--control_port", o.control_port, 1, 65535));
  RETURN_IF_ERROR(
      CheckGivenInt(app, "--metrics_port", o.metrics_port, 1, 65535));
  RETURN_IF_ERROR(
      CheckGivenInt(app, "--max_restarts", o.max_restarts, 0, kMaxRestarts));
  const bool elastic = o.plan.min_nodes != -1;
  if (elastic && StartModeNamed(o.launcher).each_generation_starts) {
    return InvalidArgument(
        "--num_nodes MIN:MAX is not supported with --launcher " + o.launcher +
        ": each generation is " +
        StartModeNamed(o.launcher).each_generation_starts +
        " over every node of the job; give --num_nodes N");
  }
  if (elastic && o.max_restarts == 0 &&
      !StartModeNamed(o.launcher).agents_join) {
    return InvalidArgument(
        "--num_nodes MIN:MAX needs --max_restarts N: the job runs on fewer "
        "nodes, or on spares, only in a generation after a failure");
  }
  if (app.count("--join_settle") && !elastic) {
    return InvalidArgument(
        "--join_settle needs --num_nodes MIN:MAX: with a fixed number of "
        "nodes a generation always waits for all of them");
  }
  for (const char* flag :
       {"--restart_backoff", "--rejoin_timeout", "--node_cooldown"}) {
    if (app.count(flag) && o.max_restarts == 0) {
      return InvalidArgument(std::string(flag) +
                             " needs --max_restarts N: without it the job "
                             "never restarts");
    }
  }
  return CheckGivenInt(app, "--ssh_fanout", o.ssh_fanout, 1, kMaxSshFanout);
}

// Flags that would do nothing without another: said, not ignored (a user who
// asked for hung jobs to be stopped must not find out after a week of one).
Status CheckWatchFlags(const CLI::App& app, const LaunchOptions& o) {
  if (app.count("--metrics_addr") && !app.count("--metrics_port")) {
    return InvalidArgument(
        "--metrics_addr needs --metrics_port P: without a port there is no "
        "metrics endpoint");
  }
  if (app.count("--on_hang") && o.hang_timeout_s <= 0) {
    return InvalidArgument(
        "--on_hang needs --hang_timeout S: without it no rank is ever named "
        "hung");
  }
  return Status::Ok();
}

// A flag given with an empty value (`-i ''`, `--include=`) is an error, never
// the default. CLI11 reads `--include= X` as `--include X`, so the words
// before PROGRAM (`options` of them) are checked for `--name=` first.
Status CheckNoEmptyValues(const CLI::App& app, const char* const* argv,
                          size_t options) {
  for (size_t i = 1; i < options; ++i) {
    std::string word = argv[i];
    if (word.size() > 1 && word.front() == '-' && word.back() == '=' &&
        app.get_option_no_throw(word.substr(0, word.size() - 1)) != nullptr) {
      return InvalidArgument(word.substr(0, word.size() - 1) +
                             ": empty value (leave the flag out for its "
                             "default)");
    }
  }
  for (const CLI::Option* opt : app.get_options()) {
    if (opt->get_expected_max() == 0) continue;  // a switch, no value
    for (const std::string& value : opt->results()) {
      if (value.empty()) {
        return InvalidArgument(opt->get_name() +
                               ": empty value (leave the flag out for its "
                               "default)");
      }
    }
  }
  return Status::Ok();
}

// PROGRAM is the first word CLI11 did not take as an option; one that starts
// with '-' is an option dslaunch does not know (`--` ends the options).
Status CheckUnknownOption(const std::vector<std::string>& remaining) {
  if (remaining.empty() || remaining.front() == "--" ||
      remaining.front().empty() || remaining.front().front() != '-') {
    return Status::Ok();
  }
  const std::string& word = remaining.front();
  return InvalidArgument(
      "unknown option '" + word.substr(0, word.find('=')) +
      "' (dslaunch --help lists the options; put -- before a PROGRAM that "
      "starts with '-')");
}

// Sets o.program to what follows the options (without a leading `--`),
// after checking the words before it: no unknown option, no empty value.
Status TakeProgram(const CLI::App& app, int argc, const char* const* argv,
                   LaunchOptions& o) {
  o.program = app.remaining();
  RETURN_IF_ERROR(CheckUnknownOption(o.program));
  if (!o.program.empty() && o.program.front() == "--")
    o.program.erase(o.program.begin());
  return CheckNoEmptyValues(app, argv,
                            static_cast<size_t>(argc) - app.remaining_size());
}

}  // namespace

static Status Validate(const LaunchOptions& o) {
  if (o.program.empty() && !o.dry_run && !o.doctor) {
    return InvalidArgument(
        "no program given: dslaunch [options] PROGRAM [ARGS...]");
  }
  RETURN_IF_ERROR(CheckDurations(o));
  for (const auto& kv : o.env) {
    const size_t eq = kv.find('=');
    if (eq == std::string::npos || eq == 0) {
      return InvalidArgument("--env '" + kv + "': expected KEY=VALUE");
    }
  }
  if (!o.log_dir.empty() && !o.each_rank_log_dir.empty()) {
    return InvalidArgument(
        "--log_dir and --enable_each_rank_log both name where rank logs go; "
        "give one");
  }
  return Status::Ok();
}

// --launcher join: the agents come to us; what they need and what cannot
// apply.
Status ValidateJoin(const CLI::App& app, LaunchOptions& o) {
  const bool join = StartModeNamed(o.launcher).agents_join;
  if (!join) {
    for (const char* flag : {"--secret_file", "--join_timeout"}) {
      if (app.count(flag))
        return InvalidArgument(std::string(flag) +
                               " is for --launcher join only");
    }
    return Status::Ok();
  }
  if (o.secret_file.empty()) {
    return InvalidArgument(
        "--launcher join needs --secret_file FILE (the job secret every "
        "joining agent must prove, e.g. a mounted Kubernetes Secret): a join "
        "job is never unauthenticated");
  }
  if (app.count("--num_nodes") == 0) {
    return InvalidArgument(
        "--launcher join needs --num_nodes N: how many agents to wait for");
  }
  for (const char* flag : {"--hostfile", "--include", "--exclude"}) {
    if (app.count(flag)) {
      return InvalidArgument(std::string(flag) +
                             " does not apply to --launcher join: the nodes "
                             "are the agents that join");
    }
  }
  if (!o.launcher_args.empty())
    return InvalidArgument("--launcher_args does not apply to --launcher join");
  if (app.count("--start_timeout")) {
    return InvalidArgument(
        "--start_timeout does not apply to --launcher join: --join_timeout "
        "bounds the wait for the agents");
  }
  if (static_cast<int64_t>(o.plan.num_nodes) * std::max(o.plan.num_gpus, 1) >
      kMaxTotalSlots) {
    return InvalidArgument("--num_nodes x --num_gpus: more than " +
                           std::to_string(kMaxTotalSlots) + " ranks");
  }
  if (o.doctor) {
    return InvalidArgument(
        "doctor checks the nodes of a hostfile or allocation; under "
        "--launcher join the nodes come to the launcher");
  }
  if (o.control_port == 0) o.control_port = kJoinControlPort;
  o.start_timeout_s = o.join_timeout_s;
  return Status::Ok();
}

// --help's one usage line: ours, not CLI11's "Usage: dslaunch [OPTIONS]" as
// well (which also hides PROGRAM).
class UsageFormatter : public CLI::Formatter {
 public:
  std::string make_usage(const CLI::App*, std::string) const override {
    return "usage: dslaunch [options] [--] PROGRAM [ARGS...]\n"
           "       dslaunch doctor [options]\n";
  }
};

StatusOr<LaunchOptions> ParseFlags(int argc, const char* const* argv,
                                   int* exit_now) {
  *exit_now = -1;
  CLI::App app("dslaunch: start and supervise one multi-node training job.",
               "dslaunch");
  auto formatter = std::make_shared<UsageFormatter>();
  formatter->column_width(30);
  app.formatter(formatter);
  LaunchOptions o;
  AddOptions(app, o);
  AddRefusedFlags(app);
  bool version = false;
  // `dslaunch doctor [options]`: the preflight alone, as a table.
  if (argc >= 2 && std::string(argv[1]) == "doctor") {
    o.doctor = true;
    ++argv;
    --argc;
  }
  app.add_flag("--version", version, "print the version and exit");
  app.prefix_command();  // everything from PROGRAM on is the rank's argv
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp&) {
    std::printf("%s", app.help().c_str());
    *exit_now = 0;
    return o;
  } catch (const CLI::ParseError& e) {
    return InvalidArgument(e.what());
  }
  if (version) {
    std::printf("dslaunch %s (protocol %u)\n", kVersion, kProtocolVersion);
    *exit_now = 0;
    return o;
  }
  o.hostfile_given = app.count("--hostfile") > 0;
  o.master_port_given = app.count("--master_port") > 0;
  RETURN_IF_ERROR(TakeProgram(app, argc, argv, o));
  RETURN_IF_ERROR(CheckRefusedFlags(app));
  if (app.count("--num_nodes"))
    RETURN_IF_ERROR(ParseNumNodes(o.num_nodes_text, kMaxHosts, o.plan));
  RETURN_IF_ERROR(CheckIntegers(app, o));
  RETURN_IF_ERROR(CheckWatchFlags(app, o));
  RETURN_IF_ERROR(Validate(o));
  RETURN_IF_ERROR(ValidateJoin(app, o));
  auto words = SplitShellWords(o.launcher_args);
  if (!words.ok())
    return InvalidArgument("--launcher_args: " + words.status().message());
  o.launcher_words = std::move(words).value();
  if (!o.bind_core_list.empty()) {
    if (!o.bind_cores_to_rank)
      return InvalidArgument(
          "--bind_core_list is used with --bind_cores_to_rank");
    auto cores = base::ParseCpuList(o.bind_core_list);
    if (!cores.ok())
      return InvalidArgument("--bind_core_list: " + cores.status().message());
    o.bind_cores = std::move(cores).value();
  }
  return o;
}

}  // namespace dslaunch::launcher
