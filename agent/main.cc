// dsagent: the per-node agent of a dslaunch job. Started by the launcher
// (local, ssh, pdsh, srun, mpirun) or already running (join); reads the job
// secret from stdin or a file (join), or makes its node's and prints it for
// the launcher (pdsh, srun, mpirun); never from argv or an environment.
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>
#include <sys/prctl.h>  // PR_SET_DUMPABLE
#include <sys/stat.h>   // lstat

#include <CLI/CLI.hpp>
#include <cstdio>
#include <cstdlib>  // getenv
#include <cstring>  // memset, strlen, strcmp

#include "agent/agent.h"
#include "agent/agent_args.h"
#include "agent/host_check.h"
#include "agent/mpi_ranks.h"
#include "agent/stack_helper.h"
#include "proto/auth.h"
#include "proto/exit_status.h"
#include "proto/host_info.h"
#include "proto/secret_line.h"
#include "proto/version.h"

// Bad flags: one line on stderr, exit 64 (EX_USAGE).
static int Usage(const dslaunch::Status& st) {
  std::fprintf(stderr, "dsagent: %s\n", st.message().c_str());
  return dslaunch::ExitStatusFor(st);
}

int main(int argc, char** argv) {
  ::prctl(PR_SET_DUMPABLE, 0);  // no rank may read our memory or secret
  dslaunch::proto::EnsureStandardDescriptors();
  if (argc == 2 && std::strcmp(argv[1], dslaunch::agent::kStackHelperFlag) == 0)
    return dslaunch::agent::RunStackHelper(0);  // stdin: the agent's socket
  CLI::App app("dsagent: runs one node's ranks of a dslaunch job");
  dslaunch::agent::AgentOptions options;
  std::string connect, log_level = "warn";
  bool version = false;
  app.add_flag("--version", version, "print the version and exit");
  bool host_check = false;
  app.add_flag("--host_check", host_check,
               "with --version: then print this node's setup warnings, one "
               "per line (dslaunch doctor)");
  app.add_option("--connect", connect, "launcher's control address HOST:PORT");
  app.add_option("--node_rank", options.node_rank,
                 "this node's index in the plan");
  app.add_option("--job_id", options.job_id, "the job's id");
  app.add_option("--log_level", log_level, "trace, debug, info, warn, error");
  app.add_option("--connect_timeout", options.connect_timeout_s,
                 "seconds to get the job from the launcher");
  // Starters that cannot write to the agent's stdin (pdsh) run the same
  // command everywhere: the agent finds its node in --hosts by --node_host
  // and makes the secret itself, printing it on stdout, which only the
  // launcher reads (through pdsh).
  std::string hosts, node_host, node_host_env;
  bool secret_stdout = false, announce = false;
  app.add_flag("--announce", announce,
               "print the version line on stdout before reading the secret");
  app.add_option("--hosts", hosts, "the plan's hosts, comma-separated");
  app.add_option("--node_host", node_host, "this node's name in --hosts");
  // srun starts one command on every node too; SLURM names the node in
  // SLURMD_NODENAME.
  app.add_option("--node_host_env", node_host_env,
                 "the variable holding this node's name in --hosts");
  app.add_flag("--secret_stdout", secret_stdout,
               "make the job secret and print it on stdout");
  // mpirun (--launcher openmpi) starts one process per rank and forwards no
  // stdin to most: each node's agent makes its secret (--secret_stdout);
  // the node's other processes prove to it the MPI key, which comes in a
  // variable (-x), erased once read, and opens nothing after the start.
  bool from_mpirun = false;
  std::string node_slots, mpi_key_env;
  app.add_flag("--from_mpirun", from_mpirun,
               "started by mpirun, one process per rank (see mpi_ranks.h)");
  app.add_option("--node_slots", node_slots,
                 "with --from_mpirun: each node's rank count, comma-separated");
  app.add_option("--mpi_key_env", mpi_key_env,
                 "with --from_mpirun: read the MPI key from this variable "
                 "(then erased)");
  // --launcher join: started by someone else (a worker pod), the agent
  // dials the launcher until it answers and proves the secret in a file.
  std::string join, secret_file, ready_file;
  double join_timeout_s = 600;
  app.add_option("--join", join,
                 "join the job of `dslaunch --launcher join` at HOST:PORT");
  app.add_option("--secret_file", secret_file,
                 "with --join: the file holding the job secret");
  app.add_option("--join_timeout", join_timeout_s,
                 "with --join: seconds to keep dialing (default 600)");
  app.add_option("--ready_file", ready_file,
                 "with --join: made once the job is joined, removed at the "
                 "end (a readiness probe)");
  CLI11_PARSE(app, argc, argv);
  if (version) {
    std::printf("dsagent %s (protocol %u)\n", dslaunch::kVersion,
                dslaunch::kProtocolVersion);
    if (host_check) {
      for (const auto& w : dslaunch::agent::SystemHostWarnings())
        std::printf("%s\n", w.c_str());
    }
    return 0;
  }
  if (join.empty() && connect.empty() &&
      std::getenv("KUBERNETES_SERVICE_HOST") != nullptr) {
    return Usage(dslaunch::InvalidArgument(
        "in a Kubernetes pod, run dsagent --join LAUNCHER_HOST:PORT "
        "--secret_file FILE (and dslaunch --launcher join in the launcher's "
        "pod); see docs/kubernetes.md"));
  }
  if (!join.empty()) {
    if (!connect.empty())
      return Usage(dslaunch::InvalidArgument("--join and --connect: give one"));
    if (secret_file.empty()) {
      return Usage(dslaunch::InvalidArgument(
          "--join needs --secret_file FILE: the job secret the launcher "
          "checks"));
    }
    auto secret = dslaunch::proto::ReadSecretFile(secret_file);
    if (!secret.ok()) return Usage(secret.status());
    for (const std::string& w :
         dslaunch::proto::SecretFileWarnings(secret_file, *secret))
      spdlog::warn("{}", w);
    if (auto st = dslaunch::proto::SplitHostPort(join, &options.launcher_host,
                                                 &options.launcher_port);
        !st.ok()) {
      return Usage(dslaunch::InvalidArgument("--join " + st.message()));
    }
    if (!(join_timeout_s > 0 && join_timeout_s <= 86400)) {
      return Usage(dslaunch::InvalidArgument(
          "--join_timeout must be in (0, 86400] seconds"));
    }
    std::optional<int> flag;
    if (app.count("--node_rank")) {
      if (options.node_rank < 0 || options.node_rank > 65535) {
        return Usage(
            dslaunch::InvalidArgument("--node_rank must be in 0..65535, got " +
                                      std::to_string(options.node_rank)));
      }
      flag = options.node_rank;
    }
    std::string said;
    auto rank =
        // A StatefulSet's pod is NAME-<ordinal>, from 0; other hosts' -N
        // (dgx-1, node-12) are no node ranks: the hostname counts in a pod.
        dslaunch::agent::JoinNodeRank(
            flag, std::getenv("JOB_COMPLETION_INDEX"),
            std::getenv("KUBERNETES_SERVICE_HOST") != nullptr
                ? dslaunch::proto::LocalHostname()
                : std::string(),
            &said);
    if (!rank.ok()) return Usage(rank.status());
    options.node_rank = *rank;
    options.secret = std::move(secret).value();
    options.join = true;
    options.join_rank_from = said;
    struct stat ready_st {};
    if (!ready_file.empty() && ::lstat(ready_file.c_str(), &ready_st) == 0) {
      return Usage(dslaunch::InvalidArgument(
          "--ready_file " + ready_file +
          " exists: the agent makes it once joined and removes it at the end, "
          "so it must name a new file"));
    }
    options.ready_file = ready_file;
    options.stdin_is_lifeline = false;
    options.connect_timeout_s = join_timeout_s;
    options.job_id = "join";  // the launcher's id comes with the job
  } else if (!secret_file.empty() || !ready_file.empty()) {
    return Usage(dslaunch::InvalidArgument(
        "--secret_file and --ready_file go with --join"));
  }
  if (!node_host_env.empty()) {
    const char* value = std::getenv(node_host_env.c_str());
    if (value == nullptr || *value == '\0') {
      return Usage(dslaunch::InvalidArgument(
          "--node_host_env " + node_host_env + ": not set on this node"));
    }
    node_host = value;
  }
  if (!node_host.empty()) {
    auto rank = dslaunch::agent::NodeRankInHosts(hosts, node_host);
    if (!rank.ok()) return Usage(rank.status());
    options.node_rank = *rank;
  }
  if (options.job_id.empty() || options.job_id.size() > 64 ||
      options.job_id.find_first_not_of("ABCDEFGHIJKLMNOPQRSTUVWXYZ"
                                       "abcdefghijklmnopqrstuvwxyz"
                                       "0123456789_-") != std::string::npos) {
    return Usage(dslaunch::InvalidArgument(
        "--job_id: 1 to 64 letters, digits, '_' or '-' are required"));
  }
  if (from_mpirun) {
    if (mpi_key_env.empty()) {
      return Usage(
          dslaunch::InvalidArgument("--from_mpirun needs --mpi_key_env"));
    }
    auto key = dslaunch::agent::TakeVariable(mpi_key_env);  // wiped
    if (!key.ok()) return Usage(key.status());
    auto slots = dslaunch::agent::ParseNodeSlots(node_slots);
    if (!slots.ok()) return Usage(slots.status());
    auto placement = dslaunch::agent::MpiPlacementFrom(
        [](const char* name) { return std::getenv(name); }, *slots);
    if (!placement.ok()) return Usage(placement.status());
    options.node_rank = placement->node_rank;
    if (placement->local_rank > 0) {
      return dslaunch::agent::RunMpiHolder(options.job_id, *key, *placement,
                                           options.connect_timeout_s);
    }
    if (!secret_stdout) {
      return Usage(
          dslaunch::InvalidArgument("--from_mpirun needs --secret_stdout"));
    }
    options.mpi = *placement;
    options.mpi_key = std::move(key).value();
  } else if (!mpi_key_env.empty()) {
    return Usage(
        dslaunch::InvalidArgument("--mpi_key_env goes with --from_mpirun"));
  }
  if (!options.join) {
    if (auto st = dslaunch::agent::ParseConnect(connect, &options.launcher_host,
                                                &options.launcher_port);
        !st.ok()) {
      return Usage(st);
    }
  }
  auto logger = spdlog::stderr_color_mt("agent");
  logger->set_pattern(
      "[%H:%M:%S.%e agent node" +
      (options.node_rank >= 0 ? std::to_string(options.node_rank) : "?") +
      " %^%l%$] %v");
  spdlog::set_default_logger(logger);
  spdlog::set_level(spdlog::level::from_str(log_level));
  if (announce) {
    std::printf("dsagent %s (protocol %u)\n", dslaunch::kVersion,
                dslaunch::kProtocolVersion);
    std::fflush(stdout);
  }
  if (secret_stdout) {
    options.secret =
        dslaunch::proto::HexEncode(dslaunch::proto::RandomBytes(32));
    std::printf(
        "%s\n",
        dslaunch::proto::SecretLine(options.node_rank, options.secret).c_str());
    std::fflush(stdout);
    options.stdin_is_lifeline = false;
  } else if (options.secret.empty() &&
             (!dslaunch::agent::ReadSecretLine(0, &options.secret) ||
              options.secret.empty())) {
    spdlog::error("no job secret on stdin");
    return dslaunch::kExitUsage;
  }
  options.stack_helper = dslaunch::agent::StackHelperCommand();
  dslaunch::agent::Agent agent(std::move(options));
  return agent.Run();
}
