// --launcher join: the job's plan from the agents that joined, once every
// node has (their hostnames, GPU counts and the addresses they came from).
// Pure function.
#pragma once

#include <map>
#include <string>

#include "base/status.h"
#include "launcher/plan/plan.h"

namespace dslaunch::launcher {

// What an agent that joined as a node said of itself, and where it came
// from as the control server saw it.
struct JoinedAgent {
  std::string hostname;  // as reported; "" = use `addr`
  int gpus = 0;
  int free_port = 0;  // a free port on its node, 0 = none
  std::string addr;
};

struct JoinedPlan {
  Plan plan;
  std::string warning;  // one sentence for the operator, or ""
};

// The agents that joined, by the node rank each claimed (0..num_nodes-1),
// in that order and renumbered densely (with --num_nodes MIN:MAX a job may
// start before every claim is taken); each claim nobody took is a spare of
// the plan ("join-N"), for an agent that joins later. --num_gpus ranks
// each, else its GPUs, else one. Hostnames are escaped and cut short (they
// reach the terminal). MASTER_ADDR is --master_addr, else node 0's address
// (a warning when that is loopback while other nodes are remote); the port
// is node 0's free one unless --master_port was given. InvalidArgument when
// a node reports more GPUs than a node may have, or the job is too large.
StatusOr<JoinedPlan> PlanFromJoinedAgents(
    const std::map<int, JoinedAgent>& joined, const PlanOptions& options,
    bool master_port_given, int num_nodes);

}  // namespace dslaunch::launcher
