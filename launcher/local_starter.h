// LocalStarter: the `local` start mode. Starts the agents of hosts that are
// this machine as child processes of the launcher, each in its own session
// (so a terminal's Ctrl-C reaches only the launcher, which coordinates), with
// PR_SET_PDEATHSIG(SIGTERM) and a stdin pipe that carries the secret and then
// stays open as a lifeline. Owned by the Launcher; io_context thread only.
#pragma once

#include <sys/types.h>

#include <boost/asio/io_context.hpp>
#include <boost/asio/signal_set.hpp>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "launcher/starter.h"

namespace dslaunch::launcher {

class LocalStarter : public Starter {
 public:
  LocalStarter(boost::asio::io_context& io, Delegate* delegate);
  ~LocalStarter() override;

  void Start(const AgentBootstrap& boot, StartDone done) override;
  void Kill(int node_rank) override;

 private:
  struct Child {
    int node_rank = 0;
    int lifeline_fd = -1;  // our end of the agent's stdin
    bool reaped = false;
  };
  Status StartAll(const AgentBootstrap& boot);
  StatusOr<pid_t> Spawn(const std::vector<std::string>& argv,
                        const std::string& secret, int* lifeline_fd);
  void WaitForSigchld();
  void Reap();

  boost::asio::io_context& io_;
  Delegate* delegate_;
  boost::asio::signal_set sigchld_;
  std::map<pid_t, Child> children_;
  std::shared_ptr<bool> alive_ = std::make_shared<bool>(true);
};

}  // namespace dslaunch::launcher
