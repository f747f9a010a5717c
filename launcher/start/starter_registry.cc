// Choosing and making the starter of the job's start mode (the modes'
// table is start_mode.cc).
#include <limits.h>  // PATH_MAX
#include <unistd.h>  // readlink

#include <boost/asio/post.hpp>

#include "base/host_info.h"
#include "launcher/start/ssh_connection.h"  // ShellQuote
#include "launcher/start/start_mode.h"
#include "launcher/start/starter.h"

namespace dslaunch::launcher {

std::string ResolveStartMode(const LaunchOptions& options, const Plan& plan) {
  if (options.launcher != "auto") return options.launcher;
  if (options.force_multi) return "ssh";  // DeepSpeed's "multi-node mode"
  for (const auto& node : plan.nodes) {
    if (!IsLocalHost(node.host)) return "ssh";
  }
  return "local";
}

StatusOr<std::unique_ptr<Starter>> MakeStarter(const StarterContext& context) {
  const std::string mode = ResolveStartMode(context.options, context.plan);
  const StartMode* m = FindStartMode(mode);
  if (m == nullptr || m->make == nullptr) {
    return InvalidArgument("--launcher " + mode +
                           " is not a start mode; use local, ssh, pdsh, "
                           "slurm, openmpi or join");
  }
  if (!context.options.launcher_args.empty() && !m->tool_args) {
    return InvalidArgument(
        "--launcher_args is passed to pdsh, srun or mpirun; --launcher " +
        mode + " runs none of them");
  }
  if (mode == "openmpi") {
    for (const auto& node : context.plan.nodes) {
      if (node.ssh_port || node.ssh_user) {
        return InvalidArgument(
            "--launcher openmpi: the hostfile gives " + node.host +
            " an ssh port or user, which mpirun cannot take from a hostfile; "
            "put them in ~/.ssh/config (mpirun runs ssh)");
      }
    }
  }
  return m->make(context);
}

void PostStartDone(boost::asio::io_context& io, std::shared_ptr<bool> alive,
                   Status st, Starter::Started started,
                   Starter::StartDone done) {
  boost::asio::post(io, [st = std::move(st), started = std::move(started),
                         done = std::move(done), alive = std::move(alive)] {
    if (!*alive) return;
    if (st.ok()) return done(started);
    done(st);
  });
}

StatusOr<base::Route> RouteToNode0(const std::string& host) {
  auto route = base::RouteTo(host);
  if (!route.ok()) {
    return Unavailable("cannot reach node 0 (" + host +
                       ") from here: " + route.status().message());
  }
  return route;
}

std::string DefaultAgentPath() {
  char buf[PATH_MAX] = {0};
  ssize_t n = ::readlink("/proc/self/exe", buf, sizeof(buf) - 1);
  if (n <= 0) return "dsagent";
  std::string self(buf, static_cast<size_t>(n));
  return self.substr(0, self.rfind('/') + 1) + "dsagent";
}

std::string AgentPath(const LaunchOptions& options) {
  return options.agent_path.empty() ? DefaultAgentPath() : options.agent_path;
}

std::vector<std::string> AgentArgv(const AgentBootstrap& boot, int node_rank,
                                   std::string connect_host) {
  const LaunchOptions& o = *boot.options;
  if (!o.control_addr.empty()) connect_host = o.control_addr;
  return {AgentPath(o),
          "--connect",
          base::JoinHostPort(connect_host, boot.control_port),
          "--node_rank",
          std::to_string(node_rank),
          "--job_id",
          boot.job_id,
          "--log_level",
          o.log_level,
          "--connect_timeout",
          std::to_string(o.start_timeout_s)};
}

// Only a process whose command line holds this job's id as a word is
// killed: the pid may have ended and been taken by another meanwhile. It
// then waits (at most 5 s) for the agent to be gone and says so: where the
// tool cannot report one node's agent's end (pdsh's first run, srun's first
// step when SLURM's own daemon on the node died), that line is its end.
std::string KillAgentCommand(const AgentProcess& agent,
                             const std::string& job_id) {
  const std::string p = std::to_string(agent.pid);
  const uint64_t start_ticks = agent.start_ticks;
  // The job's agent, and (where its Hello said when it started) the very
  // process: a pid reused later started later.
  std::string ours =
      "grep -qzxF -- " + ShellQuote(job_id) + " /proc/" + p + "/cmdline";
  if (start_ticks > 0) {
    ours = "{ " + ours + " && [ \"$(sed 's/.*) //' /proc/" + p +
           "/stat | cut -d' ' -f20)\" = " + std::to_string(start_ticks) +
           " ]; }";
  }
  return "if " + ours + " 2>/dev/null; then kill -KILL " + p +
         "; fi; i=0; while [ $i -lt 50 ] && " + ours +
         " 2>/dev/null; do sleep 0.1; i=$((i+1)); done; " + ours +
         " 2>/dev/null || echo " + kAgentGone + " " + p;
}

}  // namespace dslaunch::launcher
