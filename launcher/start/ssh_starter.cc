#include "launcher/start/ssh_starter.h"

#include <poll.h>

#include <boost/asio/post.hpp>
#include <chrono>
#include <cstdio>

#include "base/line_splitter.h"
#include "proto/progress.h"  // EscapeControlChars
#include "proto/version.h"

namespace dslaunch::launcher {

namespace asio = boost::asio;

struct SshStarter::Node {
  SshConnection conn;
  int node_rank = 0;
  bool running = false;                // agent started, channel not ended
  std::atomic<bool> kill{false};       // set by Kill(), acted on by Monitor()
  std::atomic<bool> cancelled{false};  // Kill() before the start
  bool started = false;                // io thread only
  base::LineSplitter err_lines;        // agent stderr, cut into lines
};

std::string ExpectedAgentVersion() {
  return std::string("dsagent ") + kVersion + " (protocol " +
         std::to_string(kProtocolVersion) + ")";
}

SshStarter::SshStarter(asio::io_context& io, Delegate* delegate, int fanout)
    : io_(io), delegate_(delegate), pool_(static_cast<size_t>(fanout)) {}

SshStarter::~SshStarter() {
  *alive_ = false;
  stop_ = true;
  pool_.join();
  if (monitor_.joinable()) monitor_.join();
}

// The lines a check printed after its version line, escaped and bounded.
static std::vector<std::string> NoteLines(const std::string& text) {
  constexpr size_t kMaxNotes = 16, kMaxNote = 400;
  std::vector<std::string> lines;
  size_t start = 0;
  while (start < text.size() && lines.size() < kMaxNotes) {
    size_t end = std::min(text.find('\n', start), text.size());
    if (end > start) {
      lines.push_back(proto::EscapeControlChars(std::string_view(text).substr(
          start, std::min(end - start, kMaxNote))));
    }
    start = end + 1;
  }
  return lines;
}

// Connects, then runs the node's command (the agent, which first prints its
// version line) and checks that line.
static NodeCheck CheckNode(SshConnection& conn, const SshTarget& target,
                           const SshStarter::CommandFor& command_for, int node,
                           const std::string& expected, bool read_all) {
  const auto start = std::chrono::steady_clock::now();
  NodeCheck c;
  c.host = target.host;
  c.ok = conn.Open(target, &c.failure);
  if (c.ok) {
    c.local_address = conn.local_address();
    c.peer_address = conn.peer_address();
    auto result = conn.StartAndReadLine(command_for(node, c.local_address),
                                        target.timeout_s, &c.failure, read_all);
    if (result.ok()) c.notes = NoteLines(result->rest);
    c.ok = false;
    if (!result.ok()) {
      // c.failure names the step that failed (channel or agent's answer).
    } else if (result->exit_status > 0) {
      c.failure = {
          "agent",
          "the agent is missing or does not run there (exit " +
              std::to_string(result->exit_status) + ": " + result->errors + ")",
          "install dsagent on the node at the same path, or pass --agent_path"};
    } else if (result->first_line != expected) {
      c.agent_version = result->first_line;
      c.failure = {"agent",
                   "version mismatch: node has '" + c.agent_version +
                       "', launcher needs '" + expected + "'",
                   "install the same dslaunch version on every node"};
    } else {
      c.agent_version = result->first_line;
      c.ok = true;
    }
  }
  c.seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
          .count();
  return c;
}

void SshStarter::Preflight(std::vector<SshTarget> targets,
                           CommandFor command_for,
                           const std::string& expected_version,
                           PreflightDone done, bool read_all) {
  const size_t n = targets.size();
  checks_.assign(n, NodeCheck{});
  nodes_.clear();
  for (size_t i = 0; i < n; ++i) {
    nodes_.push_back(std::make_unique<Node>());
    nodes_[i]->node_rank = static_cast<int>(i);
  }
  auto remaining = std::make_shared<size_t>(n);
  auto shared_done = std::make_shared<PreflightDone>(std::move(done));
  for (size_t i = 0; i < n; ++i) {
    asio::post(
        pool_, [this, i, target = targets[i], command_for, expected_version,
                remaining, shared_done, read_all, alive = alive_] {
          NodeCheck c;
          if (stop_ || nodes_[i]->cancelled) {
            c.host = target.host;
            c.failure = {"connect", "cancelled", "the job was stopped"};
          } else {
            c = CheckNode(nodes_[i]->conn, target, command_for,
                          static_cast<int>(i), expected_version, read_all);
          }
          c.node_rank = static_cast<int>(i);
          asio::post(io_, [this, i, c, remaining, shared_done, alive] {
            if (!*alive) return;
            checks_[i] = c;
            if (--*remaining == 0) (*shared_done)(checks_);
          });
        });
  }
}

std::vector<SshTarget> SshTargets(const LaunchOptions& o, const Plan& plan) {
  std::vector<SshTarget> targets;
  for (const auto& node : plan.nodes) {
    SshTarget t;
    t.host = node.host;
    t.port = node.ssh_port.value_or(o.ssh_port);
    t.user = node.ssh_user.value_or(o.ssh_user);
    t.identity = o.ssh_identity;
    t.config_file = o.ssh_config;
    t.known_hosts = o.ssh_known_hosts;
    t.check = o.ssh_host_key_check == "off"          ? HostKeyCheck::kOff
              : o.ssh_host_key_check == "accept-new" ? HostKeyCheck::kAcceptNew
                                                     : HostKeyCheck::kStrict;
    t.timeout_s = o.ssh_timeout_s;
    targets.push_back(std::move(t));
  }
  return targets;
}

std::string DescribeCheckFailure(const NodeCheck& c) {
  return "node " + std::to_string(c.node_rank) + " (" + c.host +
         "): " + c.failure.stage + " failed: " + c.failure.message + " -- " +
         c.failure.hint;
}

std::unique_ptr<Starter> NewSshStarter(const StarterContext& context) {
  return std::make_unique<SshStarter>(context.io, context.delegate,
                                      context.options.ssh_fanout);
}

void SshStarter::Start(const AgentBootstrap& boot, StartDone done) {
  // One command per node: the agent announces its version (the preflight's
  // check) and then waits for the secret, which comes only once every node
  // has passed. A node that fails leaves nothing: its agent ends when the
  // connection closes.
  auto command_for = [boot](int node, const std::string& local_addr) {
    std::vector<std::string> argv = AgentArgv(boot, node, local_addr);
    argv.push_back("--announce");
    std::string command;
    for (const auto& w : argv)
      command += (command.empty() ? "" : " ") + ShellQuote(w);
    return command;
  };
  boot_ = boot;
  command_for_ = command_for;
  Preflight(SshTargets(*boot.options, *boot.plan), command_for,
            ExpectedAgentVersion(),
            [this, secret = boot.secret,
             done = std::move(done)](std::vector<NodeCheck> checks) {
              std::string failures;
              for (const auto& c : checks) {
                if (!c.ok) failures += "\n" + DescribeCheckFailure(c);
              }
              if (!failures.empty()) {
                return done(
                    Unavailable("the preflight failed; nothing was "
                                "started:" +
                                failures));
              }
              // Stopped meanwhile (Ctrl-C, a node lost): no agent gets the
              // secret; those waiting for it end with their connections.
              for (const auto& node : nodes_) {
                if (node->cancelled)
                  return done(Unavailable("the start was cancelled"));
              }
              HandOverSecret(secret);
              done(Started{checks.at(0).peer_address});
            });
}

void SshStarter::HandOverSecret(const std::string& secret) {
  // The agents were started by the preflight and wait for the secret on
  // stdin; handing it over is one write per node.
  for (auto& node : nodes_) node->started = true;
  std::lock_guard<std::mutex> lock(mu_);
  monitoring_ = true;
  monitor_ = std::thread([this, secret] {
    for (auto& node : nodes_) {
      Status st = node->conn.WriteStdin(secret + "\n");
      if (st.ok()) {
        node->running = true;
        continue;
      }
      const int rank = node->node_rank;
      asio::post(io_, [this, rank, st, alive = alive_] {
        if (*alive)
          delegate_->OnAgentProcessExited(
              rank, "could not be started: " + st.message());
      });
    }
    Monitor();
  });
}

void SshStarter::StartAgain(int node_rank) {
  if (!boot_.plan || node_rank < 0 ||
      static_cast<size_t>(node_rank) >= boot_.plan->nodes.size())
    return;
  const SshTarget target =
      SshTargets(*boot_.options, *boot_.plan)[static_cast<size_t>(node_rank)];
  asio::post(pool_, [this, node_rank, target, alive = alive_] {
    if (stop_) return;
    auto node = std::make_unique<Node>();
    node->node_rank = node_rank;
    NodeCheck c = CheckNode(node->conn, target, command_for_, node_rank,
                            ExpectedAgentVersion(), false);
    Status st = c.ok ? node->conn.WriteStdin(boot_.secret + "\n")
                     : Unavailable(DescribeCheckFailure(c));
    if (!st.ok()) {
      asio::post(io_, [this, node_rank, st, alive] {
        if (*alive)
          delegate_->OnAgentProcessExited(
              node_rank, "could not be started again: " + st.message());
      });
      return;
    }
    node->started = node->running = true;
    std::lock_guard<std::mutex> lock(mu_);
    replacements_.push_back(std::move(node));
    EnsureMonitor();
  });
}

void SshStarter::EnsureMonitor() {
  if (monitoring_ || stop_) return;
  if (monitor_.joinable()) monitor_.join();  // it has returned
  monitoring_ = true;
  monitor_ = std::thread([this] { Monitor(); });
}

void SshStarter::AgentIn(int node_rank, const AgentProcess& agent) {
  if (agent.pid > 1) agent_pids_[node_rank] = agent;
}

void SshStarter::Kill(int node_rank) {
  if (auto it = agent_pids_.find(node_rank); it != agent_pids_.end()) {
    // Not dropped when the job ends meanwhile: the destructor waits for it
    // (the SSH timeout bounds it).
    asio::post(pool_, [this, node_rank, agent = it->second] {
      KillByPid(node_rank, agent);
    });
    agent_pids_.erase(it);  // once per agent
  }
  std::lock_guard<std::mutex> lock(mu_);  // the monitor may swap the node
  if (node_rank < 0 || static_cast<size_t>(node_rank) >= nodes_.size()) return;
  Node& node = *nodes_[node_rank];
  if (node.started) {
    node.kill = true;  // the monitor thread acts on it
    return;
  }
  // Still in the preflight: nothing runs there for us to stop (an agent
  // waiting for its secret exits when its connection closes).
  if (node.cancelled.exchange(true)) return;
  asio::post(io_, [this, node_rank, alive = alive_] {
    if (*alive) delegate_->OnAgentProcessExited(node_rank, "was never started");
  });
}

void SshStarter::KillByPid(int node_rank, const AgentProcess& agent) {
  if (!boot_.plan || static_cast<size_t>(node_rank) >= boot_.plan->nodes.size())
    return;
  const SshTarget target =
      SshTargets(*boot_.options, *boot_.plan)[static_cast<size_t>(node_rank)];
  SshConnection conn;
  SshFailure failure;
  if (conn.Open(target, &failure)) {
    (void)conn.StartAndReadLine(KillAgentCommand(agent, boot_.job_id),
                                target.timeout_s, &failure, true);
  }
  // Nothing to report: the agent's channel ending says that it ended.
}

void SshStarter::Monitor() {
  while (!stop_) {
    {
      // Agents started again take their node's place (its last agent ended).
      std::lock_guard<std::mutex> lock(mu_);
      for (auto& fresh : replacements_)
        nodes_[static_cast<size_t>(fresh->node_rank)] = std::move(fresh);
      replacements_.clear();
    }
    std::vector<pollfd> fds;
    for (auto& node : nodes_) {
      if (node->running)
        fds.push_back({ssh_get_fd(node->conn.session()), POLLIN, 0});
    }
    if (fds.empty()) {
      std::lock_guard<std::mutex> lock(mu_);
      if (!replacements_.empty()) continue;
      monitoring_ = false;
      return;
    }
    ::poll(fds.data(), fds.size(), 100);
    for (auto& node : nodes_) {
      if (node->running) PumpNode(*node);
    }
  }
}

void SshStarter::PumpNode(Node& node) {
  ssh_channel ch = node.conn.channel();
  if (node.kill.exchange(false)) {
    ssh_channel_request_send_signal(ch, "KILL");
    ssh_channel_send_eof(ch);  // closes the agent's lifeline too
  }
  char buf[4096];
  int n;
  std::vector<std::string> lines;
  while ((n = ssh_channel_read_nonblocking(ch, buf, sizeof(buf), 1)) > 0) {
    node.err_lines.Feed(std::string_view(buf, static_cast<size_t>(n)), &lines);
  }
  while (ssh_channel_read_nonblocking(ch, buf, sizeof(buf), 0) > 0) {
  }
  for (auto& said : lines) {
    asio::post(io_, [this, host = node.conn.host(), line = std::move(said),
                     alive = alive_]() mutable {
      if (*alive) delegate_->OnStarterOutput(host, std::move(line));
    });
  }
  if (!ssh_channel_is_eof(ch) && !ssh_channel_is_closed(ch) && n != SSH_ERROR)
    return;
  node.running = false;
  const int status = ssh_channel_get_exit_status(ch);
  const int rank = node.node_rank;
  const std::string how = status < 0
                              ? "ended (connection lost)"
                              : "exited with code " + std::to_string(status);
  asio::post(io_, [this, rank, how, alive = alive_] {
    if (*alive) delegate_->OnAgentProcessExited(rank, how);
  });
}

}  // namespace dslaunch::launcher
