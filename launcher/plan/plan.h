// Plan: which hosts and slots a job runs on and which global ranks they get,
// computed from a Hostfile and the --include/--exclude/--num_nodes/--num_gpus
// flags. Plain values built once on the launcher's main
// thread; MakePlan and FormatPlanTable are pure functions, safe on any thread.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"             // Status, StatusOr
#include "launcher/plan/hostfile.h"  // Hostfile, HostEntry

namespace dslaunch::launcher {

struct PlanOptions {
  std::string include;  // -i SPEC: host[:slot,slot][@host[:slot,...]...]
  std::string exclude;  // -e SPEC, same grammar
  int num_nodes = -1;   // -1 = all; --num_nodes MIN:MAX: MAX
  // --num_nodes MIN:MAX: the fewest nodes a generation may run on; the
  // selected hosts beyond MAX are spares. -1: a plain --num_nodes N (or
  // none), whose hosts beyond N are not used.
  int min_nodes = -1;
  int num_gpus = -1;        // -1 = all selected slots of each host
  std::string master_addr;  // empty = node 0's host
  int master_port = 29500;
};

struct NodePlan {
  int node_rank = 0;
  std::string host;
  std::vector<int>
      slots;  // selected slot ids (become CUDA_VISIBLE_DEVICES), ascending
  int first_rank = 0;  // global rank of local rank 0
  std::optional<int> ssh_port;
  std::optional<std::string> ssh_user;
  // The agent serving the node: the host's place among the job's hosts,
  // spares last. The node rank of the first generation; a later one runs
  // on the agents that are healthy then, renumbered (GenerationPlan).
  int agent = -1;
};

// One generation's layout: its nodes by node rank. The first generation's
// also names the job's spares and how few nodes a later one may run on.
struct Plan {
  std::vector<NodePlan> nodes;
  int world_size = 0;
  std::string master_addr;
  int master_port = 29500;
  // --num_nodes MIN:MAX: a generation runs on at least min_nodes nodes
  // (0: on every node of `nodes`, the job's fixed size) ...
  int min_nodes = 0;
  // ... and the hosts beyond MAX stand by, agents started, to take a lost
  // node's place: agent nodes.size() + i, node_rank -1 while they stand by.
  std::vector<NodePlan> spares;
};

// One `host[:slot,slot]` part of an --include/--exclude spec.
struct FilterTerm {
  std::string host;
  std::vector<int> slots;  // in spec order; empty = every slot of the host
};

// Parses the syntax of a filter spec (`host[:slot,...][@host[:slot,...]...]`)
// without looking at a hostfile. `flag` ("--include") prefixes every error,
// which is InvalidArgument: empty spec or host, `host:` without slots, a slot
// that is not a non-negative integer, a slot or host named twice.
StatusOr<std::vector<FilterTerm>> ParseFilterSpec(std::string_view spec,
                                                  std::string_view flag);

// Applies the filters in the order include/exclude, num_nodes, num_gpus, then
// assigns global ranks in blocks, node by node, in hostfile order. Every
// error is InvalidArgument naming the flag and the offending part.
StatusOr<Plan> MakePlan(const Hostfile& hostfile, const PlanOptions& options);

// --launcher join: node i on hosts[i] with slots[i] ranks (slot ids 0..),
// ranks in blocks in node order. Made twice: before the agents join
// ("join-0", ... with --num_gpus or 1 slot each) and once they all have
// (their hostnames and slot counts). master_addr is --master_addr (else
// set when node 0 joins), master_port --master_port, min_nodes --num_nodes
// MIN (MIN:MAX; else 0).
Plan JoinPlan(const std::vector<std::string>& hosts,
              const std::vector<int>& slots, const PlanOptions& options);

// Every agent of the job by its index, spares included: the nodes and
// spares of the first generation's plan, each at its `agent` index, with
// node_rank = agent (what the starter starts and the launcher tracks).
// min_nodes and spares are cleared.
Plan AgentPool(const Plan& plan);

// A generation on `agents` (indices into `pool`, ascending): node ranks
// 0.. in that order, global ranks in blocks node by node (torchrun's dense
// renumbering), master_addr/master_port as given.
Plan GenerationPlan(const Plan& pool, const std::vector<int>& agents,
                    const std::string& master_addr, int master_port);

// "--num_nodes" as given: "N" or "MIN:MAX" (torchrun's --nnodes). Sets
// num_nodes (MAX) and min_nodes (-1 for "N"); InvalidArgument naming the
// flag unless 1 <= MIN <= MAX <= max_nodes.
Status ParseNumNodes(std::string_view text, int max_nodes,
                     PlanOptions& options);

// "1 rank", "3 ranks".
std::string Plural(size_t n, const std::string& noun);

// A fixed-width text table (host, node rank, local rank, global rank, GPU
// slot id), one row per rank, then a line "N nodes, W ranks, master A:P"
// (master_port 0: the port is chosen at launch, a free one on node 0).
// Used by --dry-run.
std::string FormatPlanTable(const Plan& plan);

}  // namespace dslaunch::launcher
