// LocalStarter starts agents as child processes of the launcher (through a
// base::ProcessSet), each in its own session (so a terminal's Ctrl-C
// reaches only the launcher, which coordinates), with
// PR_SET_PDEATHSIG(SIGTERM) and a stdin pipe that carries the secret and
// then stays open as a lifeline. The launcher becomes a child subreaper: when
// an agent ends, whatever of its tree is left (re-parented to us) is killed.
// Owned by the Launcher; io_context thread.
#pragma once

#include <sys/types.h>

#include <boost/asio/io_context.hpp>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "base/process_set.h"
#include "launcher/start/starter.h"

namespace dslaunch::launcher {

class LocalStarter : public Starter, private base::ProcessSet::Delegate {
 public:
  LocalStarter(boost::asio::io_context& io, Starter::Delegate* delegate);
  // Closes the lifelines; the agents drain and go on their own.
  ~LocalStarter() override { *alive_ = false; }

  void Start(const AgentBootstrap& boot, StartDone done) override;
  void Kill(int node_rank) override;
  bool CanStartAgain() const override { return true; }
  void StartAgain(int node_rank) override;

 private:
  Status StartAll(const AgentBootstrap& boot);
  Status StartAgent(const NodePlan& node);
  void OnProcessOutput(pid_t pid, bool is_stderr, std::string line,
                       bool partial) override;
  void OnProcessExited(pid_t pid, const base::ExitInfo& info) override;
  void SweepOrphans();
  void RemoveCgroup(const std::string& dir);

  boost::asio::io_context& io_;
  Starter::Delegate* delegate_;
  base::ProcessSet processes_;
  std::map<pid_t, std::string> host_of_;  // agent pid -> its node's host
  std::map<pid_t, int> node_of_;          // agents not yet reported
  std::map<pid_t, std::string> cgroup_of_;
  AgentBootstrap boot_;  // for StartAgain  // the cgroup each agent makes
  std::shared_ptr<bool> alive_ = std::make_shared<bool>(true);
};

}  // namespace dslaunch::launcher
