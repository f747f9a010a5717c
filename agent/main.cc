// dsagent: the per-node agent of a dslaunch job. Started by the launcher
// (local, ssh, pdsh, srun, mpirun) or already running (join); what each
// start makes of the command line is agent/startup.h.
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>
#include <sys/prctl.h>  // PR_SET_DUMPABLE

#include <cstdio>
#include <cstdlib>  // getenv
#include <cstring>  // strcmp

#include "agent/agent.h"
#include "agent/host_check.h"
#include "agent/probe_files.h"
#include "agent/stack_helper.h"
#include "agent/startup.h"
#include "base/exit_status.h"
#include "base/host_info.h"  // EnsureStandardDescriptors
#include "proto/version.h"

namespace agent = dslaunch::agent;

static void PrintVersion() {
  std::printf("dsagent %s (protocol %u)\n", dslaunch::kVersion,
              dslaunch::kProtocolVersion);
  std::fflush(stdout);
}

static void SetUpLogging(int node_rank, const std::string& level) {
  auto logger = spdlog::stderr_color_mt("agent");
  logger->set_pattern("[%H:%M:%S.%e agent node" +
                      (node_rank >= 0 ? std::to_string(node_rank) : "?") +
                      " %^%l%$] %v");
  spdlog::set_default_logger(logger);
  spdlog::set_level(spdlog::level::from_str(level));
}

int main(int argc, char** argv) {
  ::prctl(PR_SET_DUMPABLE, 0);  // no rank may read our memory or secret
  dslaunch::base::EnsureStandardDescriptors();
  if (argc == 2 && std::strcmp(argv[1], agent::kStackHelperFlag) == 0)
    return agent::RunStackHelper(0);  // stdin: the agent's socket
  agent::AgentFlags flags;
  if (int done = agent::ParseAgentFlags(argc, argv, &flags); done >= 0)
    return done;
  if (!flags.alive_check.empty())
    return agent::CheckAlive(flags.alive_check, flags.alive_within_s);
  if (flags.version) {
    PrintVersion();
    if (flags.host_check) {
      for (const auto& w : agent::SystemHostWarnings())
        std::printf("%s\n", w.c_str());
    }
    return 0;
  }
  auto startup = agent::ResolveStartup(
      flags, [](const char* name) { return std::getenv(name); });
  if (!startup.ok()) {  // bad flags: one line, exit 64 (EX_USAGE)
    std::fprintf(stderr, "dsagent: %s\n", startup.status().message().c_str());
    return dslaunch::ExitStatusFor(startup.status());
  }
  if (startup->kind == agent::Startup::Kind::kMpiHolder) {
    return agent::RunMpiHolder(startup->options.job_id, startup->mpi_key,
                               startup->placement,
                               startup->options.connect_timeout_s);
  }
  SetUpLogging(startup->options.node_rank, flags.log_level);
  for (const auto& w : startup->warnings) spdlog::warn("{}", w);
  if (flags.announce) PrintVersion();
  if (!agent::TakeSecret(&*startup)) {
    spdlog::error("no job secret on stdin");
    return dslaunch::kExitUsage;
  }
  startup->options.stack_helper = agent::StackHelperCommand();
  agent::Agent node_agent(std::move(startup->options));
  return node_agent.Run();
}
