#include "launcher/start/pdsh_starter.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <signal.h>  // SIGKILL, SIGTERM
#include <unistd.h>

#include <boost/asio/post.hpp>
#include <chrono>
#include <cstdio>  // fwrite

#include "base/exit_status.h"
#include "base/host_info.h"
#include "base/unix_time.h"
#include "launcher/start/secret_relay.h"

namespace dslaunch::launcher {

namespace asio = boost::asio;

std::string PdshSshArgs(const SshTarget& t) {
  std::string a = "-o BatchMode=yes -o ConnectTimeout=" +
                  std::to_string(static_cast<int>(t.timeout_s));
  if (t.port > 0) a += " -p " + std::to_string(t.port);
  if (!t.user.empty()) a += " -l " + t.user;
  if (!t.identity.empty()) a += " -i " + t.identity;
  if (!t.known_hosts.empty()) a += " -o UserKnownHostsFile=" + t.known_hosts;
  if (!t.config_file.empty()) a += " -F " + t.config_file;
  a += t.check == HostKeyCheck::kStrict ? " -o StrictHostKeyChecking=yes"
       : t.check == HostKeyCheck::kAcceptNew
           ? " -o StrictHostKeyChecking=accept-new"
           : " -o StrictHostKeyChecking=no";
  return a;
}

static std::string Join(const std::vector<std::string>& v, const char* sep) {
  std::string out;
  for (const auto& s : v) out += (out.empty() ? "" : sep) + s;
  return out;
}

// How pdsh runs: in its own session (with its ssh children), stdin from
// /dev/null, output on pipes, SIGTERM when we go.
static base::ProcessSpec PdshSpec(const PdshSettings& s,
                                  const std::vector<std::string>& hosts,
                                  const std::string& command) {
  base::ProcessSpec spec;
  spec.argv = {
      s.pdsh,          "-S", "-R", "ssh", "-f", std::to_string(s.fanout), "-w",
      Join(hosts, ",")};
  spec.argv.insert(spec.argv.end(), s.extra_args.begin(), s.extra_args.end());
  spec.argv.push_back(command);
  spec.inherit_env = true;
  spec.env = {"PDSH_SSH_ARGS_APPEND=" + s.ssh_args};
  spec.new_session = true;
  spec.death_signal = SIGTERM;
  spec.destroy_signal = SIGTERM;
  return spec;
}

// Collects a preflight pdsh's lines on a private loop.
namespace {
struct Collector : base::ProcessSet::Delegate {
  std::vector<std::pair<bool, std::string>> lines;  // {is_stderr, line}
  bool done = false;
  std::string error;
  void OnProcessOutput(pid_t, bool is_stderr, std::string line, bool) override {
    lines.emplace_back(is_stderr, std::move(line));
  }
  void OnProcessExited(pid_t, const base::ExitInfo& info) override {
    done = true;
    error = info.error;
  }
};
}  // namespace

// Runs pdsh to its end on a private io_context (its own reaper waits for
// this pid only) for at most `timeout_s`; then kills pdsh's group.
static Collector RunPdsh(const base::ProcessSpec& spec, double timeout_s) {
  Collector c;
  asio::io_context io;
  base::ProcessSet set(io, &c);
  set.set_drain_after_exit(std::chrono::milliseconds(200));
  StatusOr<pid_t> pid = set.Spawn(spec);
  if (!pid.ok()) {
    c.error = pid.status().message();
    return c;
  }
  auto deadline = std::chrono::steady_clock::now() + base::Millis(timeout_s);
  for (bool killed = false; !c.done;) {
    if (std::chrono::steady_clock::now() >= deadline) {
      if (killed) break;
      set.Signal(*pid, SIGKILL);
      killed = true;
      deadline = std::chrono::steady_clock::now() + std::chrono::seconds(3);
    }
    io.run_one_for(std::chrono::milliseconds(50));
  }
  return c;
}

PdshStarter::PdshStarter(asio::io_context& io, Starter::Delegate* delegate,
                         PdshSettings settings, std::vector<std::string> hosts)
    : io_(io),
      delegate_(delegate),
      settings_(std::move(settings)),
      hosts_(std::move(hosts)),
      exits_(delegate, "pdsh"),
      processes_(io, this) {}

// processes_ sends pdsh's group SIGTERM (ProcessSpec::destroy_signal).
PdshStarter::~PdshStarter() { *alive_ = false; }

int PdshStarter::NodeOf(const std::string& host) const {
  for (size_t i = 0; i < hosts_.size(); ++i) {
    if (hosts_[i] == host) return static_cast<int>(i);
  }
  return -1;
}

// What one line of pdsh output says about a node that has not passed yet;
// `before` is what an earlier line said (the remote shell's own complaint).
static SshFailure PdshFailure(bool is_err, const std::string& said,
                              const std::string& agent_path,
                              const std::string& before) {
  if (!is_err) {
    return {"agent", "unexpected answer '" + said + "'",
            "install the same dsagent version at --agent_path"};
  }
  if (said.find("exited with exit code 127") != std::string::npos) {
    return {"agent", agent_path + " is missing on the node (" + before + ")",
            "install dsagent at the same path, or pass --agent_path"};
  }
  if (said.find("exited with exit code") != std::string::npos) {
    return {"connect", before.empty() ? said : before,
            "run ssh to the node by hand to see why"};
  }
  return {"connect", said, "run ssh to the node by hand to see why"};
}

std::vector<NodeCheck> PdshStarter::Preflight(const std::string& agent_path,
                                              const std::string& expected) {
  std::vector<NodeCheck> checks(hosts_.size());
  for (size_t i = 0; i < hosts_.size(); ++i) {
    checks[i].node_rank = static_cast<int>(i);
    checks[i].host = hosts_[i];
    checks[i].failure = {"agent", "no answer through pdsh",
                         "run the pdsh command by hand"};
    addrinfo* res = nullptr;
    if (int rc = ::getaddrinfo(hosts_[i].c_str(), nullptr, nullptr, &res);
        rc != 0) {
      checks[i].failure = {"resolve", gai_strerror(rc), "check the host name"};
    } else {
      ::freeaddrinfo(res);
    }
  }
  const Collector run = RunPdsh(
      PdshSpec(settings_, hosts_, ShellQuote(agent_path) + " --version"),
      settings_.timeout_s + 5);
  for (const auto& [is_err, raw] : run.lines) {
    std::string line = raw;
    if (line.rfind("pdsh@", 0) == 0) line = line.substr(line.find(": ") + 2);
    const size_t colon = line.find(": ");
    const int node =
        colon == std::string::npos ? -1 : NodeOf(line.substr(0, colon));
    if (node < 0 || checks[node].failure.stage == "resolve") continue;
    const std::string said = line.substr(colon + 2);
    if (!is_err && said == expected) {
      checks[node].ok = true;
    } else if (!checks[node].ok) {
      checks[node].failure =
          PdshFailure(is_err, said, agent_path, checks[node].failure.message);
    }
  }
  for (auto& c : checks) {
    if (!c.ok && !run.error.empty()) c.failure.message = run.error;
  }
  for (auto& c : checks) c.agent_version = c.ok ? expected : "";
  AddRoutes(&checks);
  return checks;
}

// Each node's addresses as routing gives them: ours toward it (what its
// agent dials) and its own.
void PdshStarter::AddRoutes(std::vector<NodeCheck>* checks) {
  for (auto& c : *checks) {
    if (auto route = base::RouteTo(c.host); route.ok()) {
      c.local_address = route->local;
      c.peer_address = route->peer;
    }
  }
}

// --no_ssh_check: no preflight run through pdsh; every node counts as
// answering, and one that does not fails the start as pdsh reports it.
std::vector<NodeCheck> PdshStarter::Unchecked() const {
  std::vector<NodeCheck> checks(hosts_.size());
  for (size_t i = 0; i < hosts_.size(); ++i) {
    checks[i].node_rank = static_cast<int>(i);
    checks[i].host = hosts_[i];
    checks[i].ok = true;
  }
  AddRoutes(&checks);
  return checks;
}

std::unique_ptr<Starter> NewPdshStarter(const StarterContext& context) {
  std::vector<std::string> hosts;
  for (const auto& node : context.plan.nodes) hosts.push_back(node.host);
  PdshSettings settings;
  settings.fanout = context.options.ssh_fanout;
  settings.timeout_s = context.options.ssh_timeout_s;
  settings.extra_args = context.options.launcher_words;
  settings.ssh_args =
      PdshSshArgs(SshTargets(context.options, context.plan).at(0));
  return std::make_unique<PdshStarter>(context.io, context.delegate, settings,
                                       hosts);
}

// pdsh runs one command line on every node: per-host settings cannot pass.
static Status CheckPdshPlan(const Plan& plan) {
  for (const auto& node : plan.nodes) {
    if (node.ssh_port || node.ssh_user) {
      return InvalidArgument("--launcher pdsh: per-host port= or user= (host " +
                             node.host +
                             ") cannot be passed through pdsh; use "
                             "--ssh_port/--ssh_user or --launcher ssh");
    }
  }
  return Status::Ok();
}

void PdshStarter::Start(const AgentBootstrap& boot, StartDone done) {
  Status st = CheckPdshPlan(*boot.plan);
  std::vector<NodeCheck> checks;
  if (st.ok()) {
    checks = boot.options->no_ssh_check
                 ? Unchecked()
                 : Preflight(AgentPath(*boot.options), ExpectedAgentVersion());
    std::string failures;
    for (const auto& c : checks) {
      if (!c.ok) failures += "\n" + DescribeCheckFailure(c);
    }
    if (!failures.empty())
      st = Unavailable("the preflight failed; nothing was started:" + failures);
  }
  if (st.ok()) {
    job_id_ = boot.job_id;
    agent_argv_ = AgentArgv(boot, 0, checks.at(0).local_address);
    std::vector<int> every(hosts_.size());
    for (size_t i = 0; i < every.size(); ++i) every[i] = static_cast<int>(i);
    st = Launch(every);
  }
  Started started;
  if (st.ok()) started.master_addr = checks.at(0).peer_address;
  PostStartDone(io_, alive_, st, started, std::move(done));
}

// pdsh runs node 0's agent command, made node-independent, on `nodes`:
// each agent finds its node rank in --hosts from pdsh's %h.
Status PdshStarter::Launch(const std::vector<int>& nodes) {
  std::vector<std::string> argv = agent_argv_, on;
  for (size_t i = 0; i + 1 < argv.size(); ++i) {
    if (argv[i] == "--node_rank")
      argv.erase(argv.begin() + i, argv.begin() + i + 2);
  }
  argv.insert(argv.end(), {"--hosts", Join(hosts_, ","), "--node_host", "%h",
                           "--secret_stdout"});
  std::string command;
  for (const auto& w : argv)
    command += (command.empty() ? "" : " ") + ShellQuote(w);
  for (int n : nodes) on.push_back(hosts_.at(static_cast<size_t>(n)));
  ASSIGN_OR_RETURN(pid_t pid,
                   processes_.Spawn(PdshSpec(settings_, on, command)));
  exits_.Started(pid, nodes);
  return Status::Ok();
}

// A pdsh of its own for the node (no preflight: what its ssh says when the
// host does not answer is the agent's end, and the Restarts try again).
void PdshStarter::StartAgain(int node_rank) {
  if (agent_argv_.empty() || node_rank < 0 ||
      static_cast<size_t>(node_rank) >= hosts_.size())
    return;
  if (Status st = Launch({node_rank}); !st.ok()) {
    const std::string why =
        "could not be started again: cannot start pdsh: " + st.message();
    asio::post(io_, [this, node_rank, why, alive = alive_] {
      if (*alive) delegate_->OnAgentProcessExited(node_rank, why);
    });
  }
}

void PdshStarter::OnProcessOutput(pid_t pid, bool is_stderr, std::string line,
                                  bool) {
  if (exits_.KillerLine(pid, line)) return;
  HandleLine(pid, is_stderr, line);
}

void PdshStarter::HandleLine(pid_t pid, bool is_stderr,
                             const std::string& raw) {
  std::string line = raw;
  if (line.rfind("pdsh@", 0) == 0) line = line.substr(line.find(": ") + 2);
  const size_t colon = line.find(": ");
  const int node =
      colon == std::string::npos ? -1 : NodeOf(line.substr(0, colon));
  const std::string said =
      colon == std::string::npos ? line : line.substr(colon + 2);
  // pdsh names the node a line came from: its secret must be that node's.
  if (RelaySecretLine(delegate_, "pdsh", said, hosts_.size(),
                      is_stderr ? -1 : node))
    return;
  delegate_->OnStarterOutput(node >= 0 ? hosts_[node] : "pdsh", said);
  if (said.find("exited with exit code") != std::string::npos)
    exits_.Ended(pid, node, said);
}

// Reported after pdsh's last line, so nodes it named are reported as it
// said; the others end with pdsh.
void PdshStarter::OnProcessExited(pid_t pid, const base::ExitInfo& info) {
  if (exits_.KillerEnded(pid)) return;
  exits_.ToolEnded(pid, info);
}

void PdshStarter::AgentIn(int node_rank, const AgentProcess& agent) {
  exits_.AgentIn(node_rank, agent);
}

void PdshStarter::Kill(int node_rank) {
  // An agent that authenticated: by pid, in a pdsh of its own (a frozen one
  // ends with neither its pdsh nor its ssh).
  exits_.KillAgent(node_rank, processes_, [&](const AgentProcess& agent) {
    return PdshSpec(settings_, {hosts_.at(static_cast<size_t>(node_rank))},
                    KillAgentCommand(agent, job_id_));
  });
  // A node of its own pdsh: that pdsh ends, and says so. In the first run
  // pdsh cannot end one node's command, and killing its ssh would only hide
  // the agent's end: pdsh reports the node when the agent has ended (the
  // kill above, its heartbeats or its connect timeout), and not before, so
  // that no new agent starts on a node where the old one and its ranks may
  // still run.
  const pid_t pid = exits_.RunOf(node_rank);
  if (pid > 0 && exits_.Alone(pid)) processes_.Signal(pid, SIGKILL);
}

}  // namespace dslaunch::launcher
