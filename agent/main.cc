// dsagent: the per-node agent of a dslaunch job. Started by the launcher
// (local, ssh, pdsh, srun, mpirun) or already running (join); reads the job
// secret from stdin, never from argv.
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>
#include <unistd.h>  // read

#include <CLI/CLI.hpp>
#include <cstdio>

#include "agent/agent.h"
#include "proto/auth.h"
#include "proto/version.h"

// The secret is one line of hex on stdin; the pipe then stays open as a
// lifeline to the launcher.
static bool ReadSecretLine(std::string* out) {
  char c;
  while (true) {
    ssize_t n = ::read(0, &c, 1);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return !out->empty();
    if (c == '\n') return true;
    if (out->size() > 4096) return false;
    out->push_back(c);
  }
}

static bool NodeRankFromHosts(const std::string& hosts, const std::string& me,
                              int* rank) {
  size_t start = 0;
  for (int i = 0; start <= hosts.size(); ++i) {
    size_t end = hosts.find(',', start);
    if (end == std::string::npos) end = hosts.size();
    if (hosts.compare(start, end - start, me) == 0) {
      *rank = i;
      return true;
    }
    start = end + 1;
  }
  return false;
}

int main(int argc, char** argv) {
  CLI::App app("dsagent: runs one node's ranks of a dslaunch job");
  dslaunch::agent::AgentOptions options;
  std::string connect, log_level = "warn";
  bool version = false;
  app.add_flag("--version", version, "print the version and exit");
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
  std::string hosts, node_host;
  bool secret_stdout = false, announce = false;
  app.add_flag("--announce", announce,
               "print the version line on stdout before reading the secret");
  app.add_option("--hosts", hosts, "the plan's hosts, comma-separated");
  app.add_option("--node_host", node_host, "this node's name in --hosts");
  app.add_flag("--secret_stdout", secret_stdout,
               "make the job secret and print it on stdout");
  CLI11_PARSE(app, argc, argv);
  if (version) {
    std::printf("dsagent %s (protocol %u)\n", dslaunch::kVersion,
                dslaunch::kProtocolVersion);
    return 0;
  }
  if (!node_host.empty() &&
      !NodeRankFromHosts(hosts, node_host, &options.node_rank)) {
    std::fprintf(stderr, "dsagent: --node_host %s is not in --hosts\n",
                 node_host.c_str());
    return 64;
  }
  const size_t colon = connect.rfind(':');
  if (colon == std::string::npos || options.job_id.empty()) {
    std::fprintf(stderr,
                 "dsagent: --connect HOST:PORT and --job_id are required\n");
    return 64;
  }
  options.launcher_host = connect.substr(0, colon);
  options.launcher_port = std::atoi(connect.c_str() + colon + 1);
  if (!options.launcher_host.empty() && options.launcher_host.front() == '[') {
    options.launcher_host =
        options.launcher_host.substr(1, options.launcher_host.size() - 2);
  }
  auto logger = spdlog::stderr_color_mt("agent");
  logger->set_pattern("[%H:%M:%S.%e agent node" +
                      std::to_string(options.node_rank) + " %^%l%$] %v");
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
    std::printf("DSLAUNCH-SECRET %s\n", options.secret.c_str());
    std::fflush(stdout);
    options.stdin_is_lifeline = false;
  } else if (!ReadSecretLine(&options.secret) || options.secret.empty()) {
    spdlog::error("no job secret on stdin");
    return 64;
  }
  dslaunch::agent::Agent agent(std::move(options));
  return agent.Run();
}
