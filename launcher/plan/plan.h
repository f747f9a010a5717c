// Plan: which hosts and slots a job runs on and which global ranks they get,
// computed from a Hostfile and the --include/--exclude/--num_nodes/--num_gpus
// flags. Plain values built once on the launcher's main
// thread; MakePlan and FormatPlanTable are pure functions, safe on any thread.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "launcher/plan/hostfile.h"  // Hostfile, HostEntry
#include "proto/status.h"            // Status, StatusOr

namespace dslaunch::launcher {

struct PlanOptions {
  std::string include;      // -i SPEC: host[:slot,slot][@host[:slot,...]...]
  std::string exclude;      // -e SPEC, same grammar
  int num_nodes = -1;       // -1 = all
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
};

struct Plan {
  std::vector<NodePlan> nodes;
  int world_size = 0;
  std::string master_addr;
  int master_port = 29500;
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
// set when node 0 joins), master_port --master_port.
Plan JoinPlan(const std::vector<std::string>& hosts,
              const std::vector<int>& slots, const PlanOptions& options);

// "1 rank", "3 ranks".
std::string Plural(size_t n, const std::string& noun);

// A fixed-width text table (host, node rank, local rank, global rank, GPU
// slot id), one row per rank, then a line "N nodes, W ranks, master A:P"
// (master_port 0: the port is chosen at launch, a free one on node 0).
// Used by --dry-run.
std::string FormatPlanTable(const Plan& plan);

}  // namespace dslaunch::launcher
