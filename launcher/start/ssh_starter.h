// SshStarter: starts one dsagent per node over SSH (libssh). Connections are
// opened in parallel on a small thread pool (bounded fan-out), each checked
// (preflight) before anything starts; then every agent is started with only
// its shell-quoted bootstrap command and the job secret on the channel's
// stdin, which stays open as a lifeline. One monitor thread relays the
// agents' own log lines and notices when an agent's channel ends. Results
// are posted to the launcher's io_context; all public methods are called on
// its thread.
#pragma once

#include <atomic>
#include <boost/asio/io_context.hpp>
#include <boost/asio/thread_pool.hpp>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "launcher/start/ssh_connection.h"
#include "launcher/start/starter.h"

namespace dslaunch::launcher {

struct NodeCheck {
  int node_rank = 0;
  std::string host;
  bool ok = false;
  SshFailure failure;              // when !ok
  std::string agent_version;       // what `dsagent --version` printed
  std::string local_address;       // route to the node, this side
  std::string peer_address;        // the node's address as reached
  std::vector<std::string> notes;  // read_all: what followed the version
  double seconds = 0;
};

class SshStarter : public Starter {
 public:
  using PreflightDone = std::function<void(std::vector<NodeCheck>)>;
  // The command to run on node_rank, given this side's address toward it.
  // It must print the agent's version line first; a job's agent then waits
  // for its secret on stdin.
  using CommandFor =
      std::function<std::string(int node_rank, const std::string& local_addr)>;

  SshStarter(boost::asio::io_context& io, Delegate* delegate, int fanout);
  ~SshStarter() override;

  // Connects to every target, runs its command and checks that the first
  // line it prints is `expected_version`. `done` runs on the io_context
  // thread with one result per target, in target order. `read_all`: the
  // command ends by itself; its further lines become NodeCheck::notes.
  void Preflight(std::vector<SshTarget> targets, CommandFor command_for,
                 const std::string& expected_version, PreflightDone done,
                 bool read_all = false);
  // The preflight with the job's agent command, then the secret to every
  // agent once all nodes passed.
  void Start(const AgentBootstrap& boot, StartDone done) override;
  // The KILL signal over the agent's channel, then its end of input. sshd
  // refuses the signal for root sessions ("requires privilege separation")
  // and a frozen agent never reads its input's end, so an agent that
  // authenticated is also killed by pid over a second SSH connection (where
  // that pid still runs this job's agent).
  void Kill(int node_rank) override;
  void AgentIn(int node_rank, const AgentProcess& agent) override;
  // A new SSH session to the node, checked as in the preflight; the agent
  // gets the secret and the monitor thread takes its channel over.
  bool CanStartAgain() const override { return true; }
  void StartAgain(int node_rank) override;
  const NodeCheck& check(int node_rank) const { return checks_[node_rank]; }

 private:
  struct Node;
  void HandOverSecret(const std::string& secret);
  // Starts the monitor thread unless it runs; mu_ held.
  void EnsureMonitor();
  void Monitor();
  void PumpNode(Node& node);
  // Kills node_rank's agent `pid` over a new SSH connection (pool thread).
  void KillByPid(int node_rank, const AgentProcess& agent);

  boost::asio::io_context& io_;
  Delegate* delegate_;
  boost::asio::thread_pool pool_;
  std::vector<NodeCheck> checks_;
  std::vector<std::unique_ptr<Node>> nodes_;
  std::thread monitor_;
  std::atomic<bool> stop_{false};
  // StartAgain: what the first start used, and the nodes started again that
  // the monitor thread has yet to take over (in nodes_). mu_ guards
  // replacements_, monitoring_ and the swap into nodes_.
  AgentBootstrap boot_;
  SshStarter::CommandFor command_for_;
  std::mutex mu_;
  std::vector<std::unique_ptr<Node>> replacements_;
  bool monitoring_ = false;
  std::map<int, AgentProcess> agent_pids_;  // io thread: node -> its agent
  std::shared_ptr<bool> alive_ = std::make_shared<bool>(true);
};

// "dsagent 0.1.0 (protocol 1)": what a matching agent prints for --version.
std::string ExpectedAgentVersion();
// "node 2 (host): connect failed: ... -- hint".
std::string DescribeCheckFailure(const NodeCheck& check);
// One SSH target per node of `plan`: hostfile port=/user= over the flags.
std::vector<SshTarget> SshTargets(const LaunchOptions& options,
                                  const Plan& plan);

}  // namespace dslaunch::launcher
