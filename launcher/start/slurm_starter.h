// SlurmStarter (--launcher slurm): the agents run as one job step of the
// allocation dslaunch runs in:
//   srun --nodes=N --ntasks=N --ntasks-per-node=1 --nodelist=H1,..,HN
//        --kill-on-bad-exit=1 --overlap --input=none --export=ALL
//        [--launcher_args] dsagent --connect ... --hosts H1,..,HN
//        --node_host_env SLURMD_NODENAME --secret_stdout
// Each agent finds its node rank from SLURMD_NODENAME in --hosts, makes its
// node's secret and prints it on stdout, which srun relays to us alone
// (slurmstepd, root, reads the task's pipe): no secret is in srun's
// environment or argv, where a rank could read it for the whole job (stdin
// would be slower too: srun forwards it only once the tasks run). Neither
// `--export` (the agents and ranks take srun's environment) nor `--output`
// (the secrets come on srun's stdout) in --launcher_args is accepted. srun's
// own messages say which agent ended ("srun: error: n2: task 1: Exited with
// exit code 3") and whether SLURM cancelled the step or the job (scancel,
// the time limit): that is reported as a stop by SLURM, as Ctrl-C would
// stop the job. A restarting job's lost node gets its agent again in a step
// of its own (--nodes=1 --nodelist=HOST), which SLURM refuses while it holds
// the node down. No SLURM library is linked. Owned by the Launcher;
// io_context thread.
#pragma once

#include <sys/types.h>

#include <boost/asio/io_context.hpp>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "base/process_set.h"
#include "launcher/start/node_exits.h"
#include "launcher/start/starter.h"

namespace dslaunch::launcher {

struct SrunSettings {
  std::string srun = "srun";
  std::vector<std::string> extra_args;  // --launcher_args, before the agent
  // --max_restarts: one agent's end must not end the step's other agents
  // (--kill-on-bad-exit=0); the launcher stops every rank itself.
  bool agents_outlive_a_peer = false;
};

// The srun command line that starts `agent_argv` on the nodes `on` of the
// job's `hosts`, one per node (each finds its node rank in `hosts`).
std::vector<std::string> SrunArgv(const SrunSettings& settings,
                                  const std::vector<std::string>& hosts,
                                  const std::vector<std::string>& on,
                                  std::vector<std::string> agent_argv);

// How srun runs it: our environment and nothing added (no secret), in its
// own session, SIGTERM when we go.
base::ProcessSpec SrunSpec(const SrunSettings& settings,
                           const std::vector<std::string>& hosts,
                           const std::vector<std::string>& on,
                           std::vector<std::string> agent_argv);

// --launcher_args srun cannot take from us: --export, --output (see above).
Status CheckSrunArgs(const SrunSettings& settings);

// What one line of srun's stderr says: the node (index in `hosts`) whose
// agent ended and how, or a cancellation by SLURM (why it ended).
struct SrunEvent {
  int node = -1;          // >= 0: that node's agent ended
  std::string how;        // ... in srun's words
  std::string cancelled;  // non-empty: SLURM stopped the step or the job
};
SrunEvent ParseSrunLine(const std::string& line,
                        const std::vector<std::string>& hosts);

class SlurmStarter : public Starter, private base::ProcessSet::Delegate {
 public:
  SlurmStarter(boost::asio::io_context& io, Starter::Delegate* delegate,
               SrunSettings settings, std::vector<std::string> hosts);
  ~SlurmStarter() override;  // srun gets SIGTERM if it still runs

  void Start(const AgentBootstrap& boot, StartDone done) override;
  // An agent that authenticated is killed by pid, in a step of its own on
  // the node (KillAgentCommand). srun cannot end one task of a step: the
  // node's own step ends, or the first one, except under --max_restarts,
  // where the others' agents stay in it and srun reports the node's agent
  // when it has ended.
  void Kill(int node_rank) override;
  void AgentIn(int node_rank, const AgentProcess& agent) override;
  bool AgentsMakeSecrets() const override { return true; }
  // In a step of its own (srun --nodes=1 --nodelist=HOST --overlap).
  bool CanStartAgain() const override { return true; }
  void StartAgain(int node_rank) override;

 private:
  Status StartSrun(const AgentBootstrap& boot);
  void OnProcessOutput(pid_t pid, bool is_stderr, std::string line,
                       bool partial) override;
  void OnProcessExited(pid_t pid, const base::ExitInfo& info) override;

  boost::asio::io_context& io_;
  Starter::Delegate* delegate_;
  SrunSettings settings_;
  std::vector<std::string> hosts_;
  NodeExits exits_;  // the first step, every node's; then one per node
  std::vector<std::string> agent_argv_;  // what each step runs
  std::string job_id_;
  Started started_;
  base::ProcessSet processes_;
  std::shared_ptr<bool> alive_ = std::make_shared<bool>(true);
};

}  // namespace dslaunch::launcher
