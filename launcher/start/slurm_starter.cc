#include "launcher/start/slurm_starter.h"

#include <signal.h>  // SIGKILL, SIGTERM

#include <boost/asio/post.hpp>
#include <optional>

#include "launcher/start/secret_relay.h"

namespace dslaunch::launcher {

namespace asio = boost::asio;

static std::string Join(const std::vector<std::string>& v) {
  std::string out;
  for (const auto& s : v) out += (out.empty() ? "" : ",") + s;
  return out;
}

// srun's own words: a step of one task per node on `on`, running `argv`.
static std::vector<std::string> StepArgv(const SrunSettings& s,
                                         const std::vector<std::string>& on,
                                         const std::vector<std::string>& argv) {
  const std::string n = std::to_string(on.size());
  std::vector<std::string> out = {
      s.srun,
      "--nodes=" + n,
      "--ntasks=" + n,
      "--ntasks-per-node=1",
      "--nodelist=" + Join(on),
      s.agents_outlive_a_peer ? "--kill-on-bad-exit=0" : "--kill-on-bad-exit=1",
      "--overlap",
      "--input=none",
      "--export=ALL",
      "--job-name=dsagent"};
  out.insert(out.end(), s.extra_args.begin(), s.extra_args.end());
  out.insert(out.end(), argv.begin(), argv.end());
  return out;
}

std::vector<std::string> SrunArgv(const SrunSettings& s,
                                  const std::vector<std::string>& hosts,
                                  const std::vector<std::string>& on,
                                  std::vector<std::string> agent_argv) {
  // The step runs one command everywhere: each agent finds its node itself.
  for (size_t i = 0; i + 1 < agent_argv.size(); ++i) {
    if (agent_argv[i] == "--node_rank")
      agent_argv.erase(agent_argv.begin() + i, agent_argv.begin() + i + 2);
  }
  agent_argv.insert(agent_argv.end(),
                    {"--hosts", Join(hosts), "--node_host_env",
                     "SLURMD_NODENAME", "--secret_stdout"});
  return StepArgv(s, on, agent_argv);
}

// How srun runs: our environment (srun reads the allocation from it), in
// its own session, SIGTERM when we go.
static base::ProcessSpec StepSpec(std::vector<std::string> argv) {
  base::ProcessSpec spec;
  spec.argv = std::move(argv);
  spec.inherit_env = true;
  spec.new_session = true;
  spec.death_signal = SIGTERM;
  spec.destroy_signal = SIGTERM;
  return spec;
}

base::ProcessSpec SrunSpec(const SrunSettings& settings,
                           const std::vector<std::string>& hosts,
                           const std::vector<std::string>& on,
                           std::vector<std::string> agent_argv) {
  return StepSpec(SrunArgv(settings, hosts, on, std::move(agent_argv)));
}

SrunEvent ParseSrunLine(const std::string& line,
                        const std::vector<std::string>& hosts) {
  SrunEvent e;
  // slurmstepd: error: *** JOB 12 ON n1 CANCELLED AT 2026-... DUE TO TIME LIMIT
  // *** slurmstepd: error: *** STEP 12.0 ON n1 CANCELLED AT 2026-... ***
  const size_t stars = line.find("*** ");
  if (stars != std::string::npos &&
      line.find(" CANCELLED AT ", stars) != std::string::npos) {
    const bool job = line.compare(stars + 4, 4, "JOB ") == 0;
    const size_t id_end = line.find(' ', stars + (job ? 8 : 9));
    const std::string id =
        line.substr(stars + (job ? 8 : 9), id_end - stars - (job ? 8 : 9));
    e.cancelled =
        std::string("SLURM cancelled ") + (job ? "job " : "step ") + id;
    const size_t due = line.find(" DUE TO ");
    if (due != std::string::npos) {
      std::string why = line.substr(due + 8);
      if (why.size() >= 4 && why.compare(why.size() - 4, 4, " ***") == 0)
        why.resize(why.size() - 4);
      for (char& c : why) c = static_cast<char>(std::tolower(c));
      e.cancelled += " (" + why + ")";
    } else {
      e.cancelled += " (scancel)";
    }
    return e;
  }
  // srun: error: n2: task 1: Exited with exit code 3
  // srun: error: n2: tasks 0-1: Killed
  static const std::string kError = "srun: error: ";
  if (line.rfind(kError, 0) != 0) return e;
  const size_t host_end = line.find(": ", kError.size());
  if (host_end == std::string::npos) return e;
  const std::string host = line.substr(kError.size(), host_end - kError.size());
  if (line.compare(host_end + 2, 4, "task") != 0) return e;
  const size_t how = line.find(": ", host_end + 2);
  if (how == std::string::npos) return e;
  for (size_t i = 0; i < hosts.size(); ++i) {
    if (hosts[i] == host) {
      e.node = static_cast<int>(i);
      e.how = line.substr(how + 2);
    }
  }
  return e;
}

SlurmStarter::SlurmStarter(asio::io_context& io, Starter::Delegate* delegate,
                           SrunSettings settings,
                           std::vector<std::string> hosts)
    : io_(io),
      delegate_(delegate),
      settings_(std::move(settings)),
      hosts_(std::move(hosts)),
      exits_(delegate, "srun"),
      processes_(io, this) {}

// processes_ sends srun SIGTERM (ProcessSpec::destroy_signal): srun passes
// it to the step and ends it.
SlurmStarter::~SlurmStarter() { *alive_ = false; }

std::unique_ptr<Starter> NewSlurmStarter(const StarterContext& context) {
  std::vector<std::string> hosts;
  for (const auto& node : context.plan.nodes) hosts.push_back(node.host);
  SrunSettings settings;
  settings.extra_args = context.options.launcher_words;
  settings.agents_outlive_a_peer = context.options.max_restarts > 0;
  return std::make_unique<SlurmStarter>(context.io, context.delegate,
                                        std::move(settings), std::move(hosts));
}

void SlurmStarter::Start(const AgentBootstrap& boot, StartDone done) {
  Status st = StartSrun(boot);
  PostStartDone(io_, alive_, st, started_, std::move(done));
}

Status CheckSrunArgs(const SrunSettings& s) {
  for (const auto& word : s.extra_args) {
    if (word.rfind("--export", 0) == 0) {
      return InvalidArgument(
          "--launcher_args: srun's " + word +
          " is not accepted: the agents take srun's environment, and ranks "
          "get the job's environment from dslaunch (--exports, --env, "
          ".deepspeed_env)");
    }
    if (word.rfind("--output", 0) == 0 ||
        (word.rfind("-o", 0) == 0 && word.rfind("--", 0) != 0)) {
      return InvalidArgument("--launcher_args: srun's " + word +
                             " is not accepted: the agents hand dslaunch "
                             "their secrets on srun's output");
    }
  }
  return Status::Ok();
}

Status SlurmStarter::StartSrun(const AgentBootstrap& boot) {
  RETURN_IF_ERROR(CheckSrunArgs(settings_));
  // The agents dial back our address on the route to node 0 (the nodes of
  // an allocation share a network); node 0's end of it is MASTER_ADDR.
  ASSIGN_OR_RETURN(base::Route route, RouteToNode0(hosts_.at(0)));
  started_.master_addr = route.peer;
  job_id_ = boot.job_id;
  agent_argv_ = AgentArgv(boot, 0, route.local);
  StatusOr<pid_t> pid =
      processes_.Spawn(SrunSpec(settings_, hosts_, hosts_, agent_argv_));
  if (!pid.ok())
    return Unavailable("cannot start srun: " + pid.status().message());
  exits_.StartedAll(*pid, hosts_.size());
  return Status::Ok();
}

// A step of its own for the node: srun refuses it while SLURM holds the
// node down or failed (srun's error says so and ends it; the Restarts try
// again), and starts the agent once SLURM has the node back.
void SlurmStarter::StartAgain(int node_rank) {
  if (agent_argv_.empty() || node_rank < 0 ||
      static_cast<size_t>(node_rank) >= hosts_.size())
    return;
  const std::string& host = hosts_[static_cast<size_t>(node_rank)];
  StatusOr<pid_t> pid =
      processes_.Spawn(SrunSpec(settings_, hosts_, {host}, agent_argv_));
  if (!pid.ok()) {
    const std::string why = "could not be started again: cannot start srun: " +
                            pid.status().message();
    asio::post(io_, [this, node_rank, why, alive = alive_] {
      if (*alive) delegate_->OnAgentProcessExited(node_rank, why);
    });
    return;
  }
  exits_.Started(*pid, {node_rank});
}

void SlurmStarter::OnProcessOutput(pid_t pid, bool, std::string line, bool) {
  if (exits_.KillerLine(pid, line)) return;
  // A step for one node relays that node's secret only.
  std::optional<int> from;
  if (exits_.Alone(pid)) from = exits_.NodeOf(pid);
  if (RelaySecretLine(delegate_, "srun", line, hosts_.size(), from)) return;
  const SrunEvent e = ParseSrunLine(line, hosts_);
  delegate_->OnStarterOutput("srun", line);
  if (!e.cancelled.empty()) delegate_->OnStoppedByScheduler(e.cancelled);
  exits_.Ended(pid, e.node, e.how);
}

void SlurmStarter::OnProcessExited(pid_t pid, const base::ExitInfo& info) {
  if (exits_.KillerEnded(pid)) return;
  exits_.ToolEnded(pid, info);
}

void SlurmStarter::AgentIn(int node_rank, const AgentProcess& agent) {
  exits_.AgentIn(node_rank, agent);
}

// srun cannot end one task of a step. A step of the node's own ends; the
// first one ends whole unless the job restarts, where the others' agents
// must stay: then the node's agent ends by the kill by pid, its heartbeats
// or its connect timeout, and srun's word of it is its end (no new agent
// starts on the node before: the old one and its ranks may still run).
void SlurmStarter::Kill(int node_rank) {
  // An agent that authenticated: by pid, in a step of its own on the node
  // (a frozen one ignores its step's end until SLURM's own kill).
  exits_.KillAgent(node_rank, processes_, [&](const AgentProcess& agent) {
    return StepSpec(
        StepArgv(settings_, {hosts_.at(static_cast<size_t>(node_rank))},
                 {"/bin/sh", "-c", KillAgentCommand(agent, job_id_)}));
  });
  const pid_t pid = exits_.RunOf(node_rank);
  if (pid > 0 && (exits_.Alone(pid) || !settings_.agents_outlive_a_peer))
    processes_.Signal(pid, SIGKILL);
}

}  // namespace dslaunch::launcher
