// PdshStarter: starts the agents through pdsh, for sites that mandate it.
// pdsh runs one command on every node and cannot write to the remote
// commands' stdin, so each agent finds its node from `--node_host %h` and
// makes its own secret, printing it on stdout; pdsh relays that output to
// the launcher only, which then authenticates that node's agent with it.
// The control connection is the same as with every starter. Owned by the
// Launcher; io_context thread only (the preflight blocks the caller).
#pragma once

#include <sys/types.h>

#include <boost/asio/io_context.hpp>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "base/process_set.h"
#include "launcher/start/node_exits.h"
#include "launcher/start/ssh_starter.h"  // NodeCheck
#include "launcher/start/starter.h"

namespace dslaunch::launcher {

struct PdshSettings {
  std::string pdsh = "pdsh";
  int fanout = 32;
  std::string ssh_args;  // PDSH_SSH_ARGS_APPEND: port, user, identity, ...
  double timeout_s = 10;
  std::vector<std::string> extra_args;  // --launcher_args, after -w HOSTS
};

class PdshStarter : public Starter, private base::ProcessSet::Delegate {
 public:
  PdshStarter(boost::asio::io_context& io, Starter::Delegate* delegate,
              PdshSettings settings, std::vector<std::string> hosts);
  ~PdshStarter() override;

  // Runs `agent --version` on every node through pdsh (blocking).
  std::vector<NodeCheck> Preflight(const std::string& agent_path,
                                   const std::string& expected_version);
  // Without the preflight (--no_ssh_check): every node counts as answering.
  std::vector<NodeCheck> Unchecked() const;
  // The preflight (blocking), then pdsh running node 0's agent command made
  // node-independent on every node.
  void Start(const AgentBootstrap& boot, StartDone done) override;
  // An agent that authenticated is killed by pid through a pdsh of its own
  // (KillAgentCommand); a node of its own pdsh: that pdsh ends too. In the
  // first run the node's end is reported when pdsh reports it.
  void Kill(int node_rank) override;
  void AgentIn(int node_rank, const AgentProcess& agent) override;
  bool AgentsMakeSecrets() const override { return true; }
  // In a pdsh of its own (pdsh -w HOST).
  bool CanStartAgain() const override { return true; }
  void StartAgain(int node_rank) override;

 private:
  Status Launch(const std::vector<int>& nodes);
  void OnProcessOutput(pid_t pid, bool is_stderr, std::string line,
                       bool partial) override;
  void OnProcessExited(pid_t pid, const base::ExitInfo& info) override;
  void HandleLine(pid_t pid, bool is_stderr, const std::string& line);
  int NodeOf(const std::string& host) const;
  static void AddRoutes(std::vector<NodeCheck>* checks);

  boost::asio::io_context& io_;
  Starter::Delegate* delegate_;
  PdshSettings settings_;
  std::vector<std::string> hosts_;
  NodeExits exits_;  // the first pdsh, every node's; then one per node
  std::vector<std::string> agent_argv_;  // node 0's agent command
  std::string job_id_;
  base::ProcessSet processes_;  // pdsh, its output and its exit
  std::shared_ptr<bool> alive_ = std::make_shared<bool>(true);
};

// PDSH_SSH_ARGS_APPEND for the launcher's --ssh_* settings.
std::string PdshSshArgs(const SshTarget& target);

}  // namespace dslaunch::launcher
