// JoinStarter (--launcher join): starts nothing. The agents are started by
// someone else (Kubernetes/OpenShift worker pods, a site's own tooling) as
// `dsagent --join HOST:PORT --secret_file F` and dial the control server,
// which gives each a node rank (ControlServer::Options::join); the Job makes
// the plan once all --num_nodes have joined. Kill cannot reach a pod: it
// reports the node's agent as ended, so that a job stopping with nodes that
// never joined (or stopped answering) can end; a joined agent stops its
// ranks itself when it hears the Abort or loses the launcher. A lost node's
// agent is "started again" by the platform (the pod restarted, or a new pod
// with the same index): StartAgain only waits for it to join as that node.
// Owned by the Launcher; io_context thread.
#pragma once

#include <boost/asio/io_context.hpp>
#include <memory>
#include <set>

#include "launcher/start/starter.h"

namespace dslaunch::launcher {

class JoinStarter : public Starter {
 public:
  JoinStarter(boost::asio::io_context& io, Starter::Delegate* delegate);
  ~JoinStarter() override;

  void Start(const AgentBootstrap& boot, StartDone done) override;
  void Kill(int node_rank) override;
  bool SeesAgentProcesses() const override { return false; }
  bool CanStartAgain() const override { return true; }
  void StartAgain(int node_rank) override { killed_.erase(node_rank); }

 private:
  boost::asio::io_context& io_;
  Starter::Delegate* delegate_;
  std::set<int> killed_;
  std::shared_ptr<bool> alive_ = std::make_shared<bool>(true);
};

}  // namespace dslaunch::launcher
