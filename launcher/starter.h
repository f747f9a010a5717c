// How the launcher gets one dsagent running per node. A Starter starts the
// agents (the secret goes over each agent's stdin, never argv), keeps their
// lifelines open, and tells its Delegate when an agent process ends. The
// `local` starter lives here; ssh, pdsh, srun and mpirun starters implement
// the same interface. Owned by the Launcher; io_context thread only.
#pragma once

#include <sys/types.h>

#include <boost/asio/io_context.hpp>
#include <boost/asio/signal_set.hpp>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "proto/status.h"

namespace dslaunch::launcher {

struct AgentLaunch {
  int node_rank = 0;
  std::string host;
  std::vector<std::string> argv;  // dsagent and its flags
};

class Starter {
 public:
  class Delegate {
   public:
    virtual ~Delegate() = default;
    // The agent process of `node_rank` ended; `how` says with what status.
    virtual void OnAgentProcessExited(int node_rank,
                                      const std::string& how) = 0;
    // Starters whose agents make their own secret (pdsh) report it here.
    virtual void OnAgentSecret(int node_rank, std::string secret) {
      (void)node_rank;
      (void)secret;
    }
  };
  virtual ~Starter() = default;
  // Starts one agent per entry, writing `secret` + "\n" to its stdin.
  virtual Status Start(const std::vector<AgentLaunch>& launches,
                       const std::string& secret) = 0;
  // Last resort when an agent does not respond: kill it outright.
  virtual void Kill(int node_rank) = 0;
};

// True when `host` names this machine: a loopback address (all of
// 127.0.0.0/8 and ::1), "localhost", or an address of a local interface.
bool IsLocalHost(const std::string& host);

}  // namespace dslaunch::launcher

// LocalStarter moved to its own file; included here until its users do.
#include "launcher/local_starter.h"  // IWYU pragma: export
