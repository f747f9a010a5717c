// Starter: the one thing a start mode implements. It
// starts one dsagent per node of the plan, each dialing the control server
// back (the job secret goes over the agent's stdin; where the tool forwards
// no stdin, each agent makes its node's secret and the tool relays it to us:
// never argv, never an environment), reports an agent process that ends,
// and kills one as a last resort. Start modes: local, ssh, pdsh, slurm, openmpi
// (start/*_starter.cc), chosen by
// MakeStarter (starter_registry.cc): adding one is a new file and one line
// there. Owned by the Launcher; io_context thread only.
#pragma once

#include <boost/asio/io_context.hpp>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "base/host_info.h"  // Route
#include "base/status.h"
#include "launcher/options.h"
#include "launcher/plan/addresses.h"  // IsLocalHost
#include "launcher/plan/plan.h"

namespace dslaunch::launcher {

// What every start mode gets to start the agents of one job.
struct AgentBootstrap {
  const Plan* plan = nullptr;
  const LaunchOptions* options = nullptr;
  std::string job_id;
  std::string secret;
  int control_port = 0;
};

// The dsagent command line for node_rank dialing connect_host (this side's
// address as that node reaches it; --control_addr overrides) at the port.
std::vector<std::string> AgentArgv(const AgentBootstrap& boot, int node_rank,
                                   std::string connect_host);
// The remote command that kills `pid` if it is job_id's agent, then prints
// "<kAgentGone> PID" once no agent of the job is that pid: where a start
// tool cannot end one node's agent (a frozen one; pdsh's first run, srun's
// first step) or report its end, this does.
struct AgentProcess {
  int64_t pid = 0;
  uint64_t start_ticks = 0;  // 0: not known (an older agent)
};
std::string KillAgentCommand(const AgentProcess& agent,
                             const std::string& job_id);
inline constexpr const char* kAgentGone = "dslaunch-agent-gone";
// The agent next to this dslaunch binary.
std::string DefaultAgentPath();
// --agent_path, else DefaultAgentPath().
std::string AgentPath(const LaunchOptions& options);

class Starter {
 public:
  class Delegate {
   public:
    virtual ~Delegate() = default;
    // The agent process of `node_rank` ended; `how` says with what status.
    virtual void OnAgentProcessExited(int node_rank,
                                      const std::string& how) = 0;
    // Starters whose agents make their own secret (AgentsMakeSecrets)
    // report each here, as the tool relayed it.
    virtual void OnAgentSecret(int node_rank, std::string secret) {
      (void)node_rank;
      (void)secret;
    }
    // A line an agent or the start mode's tool printed outside the control
    // connection (ssh stderr, pdsh's own messages); `source` names its host.
    virtual void OnStarterOutput(const std::string& source,
                                 std::string line) = 0;
    // The batch system ended the job (scancel, a time limit): stop as
    // Ctrl-C would; `why` says who and why, for the report.
    virtual void OnStoppedByScheduler(const std::string& why) { (void)why; }
  };

  struct Started {
    // Node 0's address as the other nodes reach it, when the mode learned it
    // (ssh: the address its connection reached); empty = the plan's.
    std::string master_addr;
  };
  using StartDone = std::function<void(StatusOr<Started>)>;

  virtual ~Starter() = default;
  // Starts one agent per node of boot.plan. `done` runs on the io_context
  // once every agent was started, or with why nothing was (nothing of the
  // job is then left running anywhere). Called once.
  virtual void Start(const AgentBootstrap& boot, StartDone done) = 0;
  // Last resort for an agent that does not respond or has not connected:
  // ends it (and, with it, its workers). OnAgentProcessExited follows.
  virtual void Kill(int node_rank) = 0;
  // node_rank's agent authenticated, as process `pid` on its node (its
  // Hello): what Kill may aim at where the tool cannot end it.
  virtual void AgentIn(int node_rank, const AgentProcess& agent) {
    (void)node_rank;
    (void)agent;
  }
  // The job is stopping (a failure, a signal, its end): what the start tool
  // says from now on is about the teardown.
  virtual void Stopping() {}
  // Whether each agent makes its own node's secret and the starter hands it
  // over (Delegate::OnAgentSecret: pdsh, srun, mpirun) instead of proving
  // AgentBootstrap::secret. Such a secret is good for one connection only,
  // and no node gets its job before every node's agent authenticated: until
  // then a secret may still be in the tool's pipe to us, which a rank of the
  // same user could open through /proc.
  virtual bool AgentsMakeSecrets() const { return false; }
  // Whether OnAgentProcessExited follows each agent's end promptly. When not
  // (mpirun's daemons own the agents and report late), an agent that said
  // it is done and closed its connection counts as ended.
  virtual bool SeesAgentProcesses() const { return true; }
  // Whether a lost node's agent can be started again (StartAgain) for a
  // later generation of a restarting job.
  virtual bool CanStartAgain() const { return false; }
  // Starts node_rank's agent again, as Start did (its last one has ended):
  // it connects, or OnAgentProcessExited says why not.
  virtual void StartAgain(int node_rank) { (void)node_rank; }
};

// Runs `done` on the loop, with `started` when `st` is ok, else with `st`,
// unless `alive` is false by then (the starter is gone): Start's answer is
// never given from within Start.
void PostStartDone(boost::asio::io_context& io, std::shared_ptr<bool> alive,
                   Status st, Starter::Started started,
                   Starter::StartDone done);

// This side's address on the route to node 0's `host` and node 0's own
// (its MASTER_ADDR), for modes whose one tool starts every agent (srun,
// mpirun: the nodes share a network); Unavailable naming node 0 otherwise.
StatusOr<base::Route> RouteToNode0(const std::string& host);

// What a start mode is built with.
struct StarterContext {
  boost::asio::io_context& io;
  Starter::Delegate* delegate;
  const LaunchOptions& options;
  const Plan& plan;
};

// The start mode --launcher names; `auto` is ssh when a host of the plan is
// not this machine or --force_multi is given, else local.
std::string ResolveStartMode(const LaunchOptions& options, const Plan& plan);
// Makes the starter of the resolved start mode, or InvalidArgument.
StatusOr<std::unique_ptr<Starter>> MakeStarter(const StarterContext& context);

// The registered start modes' factories (starter_registry.cc).
std::unique_ptr<Starter> NewLocalStarter(const StarterContext& context);
std::unique_ptr<Starter> NewSshStarter(const StarterContext& context);
std::unique_ptr<Starter> NewPdshStarter(const StarterContext& context);
std::unique_ptr<Starter> NewSlurmStarter(const StarterContext& context);
std::unique_ptr<Starter> NewOpenMpiStarter(const StarterContext& context);
std::unique_ptr<Starter> NewJoinStarter(const StarterContext& context);

}  // namespace dslaunch::launcher
