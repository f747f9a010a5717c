// NodeExits: for start modes whose tool process starts several nodes'
// agents at once (pdsh, srun, mpirun). Each run of the tool (a pid) starts
// the agents of some nodes: the first one every node's, a later one (a lost
// node's agent started again) one node's. It reports each agent's end to the
// Starter's delegate exactly once: as the run's output names it, or, when
// the run itself ends, every node of it not reported yet as ended with it.
// A node's agent is started again only after its last one ended, so a node
// belongs to one running run at a time. io_context thread only.
#pragma once

#include <sys/types.h>

#include <map>
#include <set>
#include <string>
#include <vector>

#include "launcher/start/starter.h"
#include "proto/process_set.h"  // ExitInfo

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
  void ToolEnded(pid_t pid, const proto::ExitInfo& info);
  // The run that started node's newest agent, while it runs, or -1.
  pid_t RunOf(int node) const;
  // Whether the run `pid` started one node's agent only; which node that is
  // (-1: it started several, or it is not running).
  bool Alone(pid_t pid) const { return NodeOf(pid) >= 0; }
  int NodeOf(pid_t pid) const;

 private:
  struct Run {
    std::vector<int> nodes;  // started
    std::set<int> running;   // not reported ended
  };
  Starter::Delegate* delegate_;
  std::string tool_;
  std::map<pid_t, Run> runs_;
  std::map<int, pid_t> latest_;  // node -> the run of its newest agent
};

}  // namespace dslaunch::launcher
