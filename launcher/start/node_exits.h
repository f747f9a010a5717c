// NodeExits: for start modes whose tool process starts several nodes'
// agents at once (pdsh, srun, mpirun). Each run of the tool (a pid) starts
// the agents of some nodes: the first one every node's, a later one (a lost
// node's agent started again) one node's. It reports each agent's end to the
// Starter's delegate exactly once: as the run's output names it, or, when
// the run itself ends, every node of it not reported yet as ended with it.
// A node's agent is started again only after its last one ended, so a node
// belongs to one running run at a time. It also keeps each agent's pid (its
// Hello) and the runs that kill an agent by it (KillAgentCommand): their
// "gone" line is that agent's end, which its own run may never report.
// io_context thread only.
#pragma once

#include <sys/types.h>

#include <functional>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "base/process_set.h"  // ExitInfo
#include "launcher/start/starter.h"

namespace dslaunch::launcher {

class NodeExits {
 public:
  NodeExits(Starter::Delegate* delegate, std::string tool);
  // The run `pid` starts the agents of `nodes`.
  void Started(pid_t pid, const std::vector<int>& nodes);
  // ... of nodes 0..count-1.
  void StartedAll(pid_t pid, size_t count);
  // The run `pid` says node `node`'s agent ended (`how`, in the tool's
  // words): reported once; a node the run does not hold is ignored.
  void Ended(pid_t pid, int node, const std::string& how);
  // The run `pid` ended: "ended with <tool>, which ..." for each of its
  // nodes left.
  void ToolEnded(pid_t pid, const base::ExitInfo& info);
  // The run that started node's newest agent, while it runs, or -1.
  pid_t RunOf(int node) const;
  // Whether the run `pid` started one node's agent only; which node that is
  // (-1: it started several, or it is not running).
  bool Alone(pid_t pid) const { return NodeOf(pid) >= 0; }
  int NodeOf(pid_t pid) const;

  // node's agent authenticated as process `pid` on its node.
  void AgentIn(int node, const AgentProcess& agent);
  // Kills node's agent by its pid, once, with the run `spec_for(pid)` made
  // (KillAgentCommand inside the tool) through `processes`. The run outlives
  // the launcher: a job that ends now must not take the kill with it (the
  // tool's own timeout bounds it). Nothing when the pid is not known.
  void KillAgent(
      int node, base::ProcessSet& processes,
      const std::function<base::ProcessSpec(const AgentProcess&)>& spec_for);
  // Output and end of a run: true when it is a kill run (taken here).
  bool KillerLine(pid_t pid, const std::string& line);
  bool KillerEnded(pid_t pid) { return killers_.erase(pid) > 0; }

 private:
  struct Run {
    std::vector<int> nodes;  // started
    std::set<int> running;   // not reported ended
  };
  Starter::Delegate* delegate_;
  std::string tool_;
  std::map<pid_t, Run> runs_;
  std::map<int, pid_t> latest_;  // node -> the run of its newest agent
  std::map<int, AgentProcess> agent_pids_;  // node -> its agent
  std::map<pid_t, int> killers_;            // kill run -> its node
};

}  // namespace dslaunch::launcher
