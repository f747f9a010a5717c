#include "launcher/plan/joined_plan.h"

#include <vector>

#include "launcher/plan/hostfile.h"  // kMaxSlotsPerHost, kMaxTotalSlots
#include "proto/progress.h"          // EscapeForLog

namespace dslaunch::launcher {

namespace {

bool Loopback(const std::string& addr) {
  return addr.rfind("127.", 0) == 0 || addr == "::1";
}

}  // namespace

StatusOr<JoinedPlan> PlanFromJoinedAgents(
    const std::map<int, JoinedAgent>& joined, const PlanOptions& options,
    bool master_port_given, int num_nodes) {
  if (joined.empty()) return InvalidArgument("no agent joined");
  std::vector<std::string> hosts;
  std::vector<int> slots;
  int64_t world = 0;
  for (const auto& [node, j] : joined) {
    // What agents say of themselves reaches the terminal escaped.
    hosts.push_back(
        proto::EscapeForLog(j.hostname.empty() ? j.addr : j.hostname, 255));
    if (options.num_gpus <= 0 && j.gpus > kMaxSlotsPerHost) {
      return InvalidArgument(
          "node " + std::to_string(node) + " (" + hosts.back() + ") reports " +
          std::to_string(j.gpus) + " GPUs, more than " +
          std::to_string(kMaxSlotsPerHost) + " per node; --num_gpus sets it");
    }
    slots.push_back(options.num_gpus > 0 ? options.num_gpus
                    : j.gpus > 0         ? j.gpus
                                         : 1);
    world += slots.back();
  }
  if (world > kMaxTotalSlots) {
    return InvalidArgument(std::to_string(world) + " ranks in all, more than " +
                           std::to_string(kMaxTotalSlots));
  }
  JoinedPlan out;
  out.plan = JoinPlan(hosts, slots, options);
  size_t i = 0;
  for (const auto& [claim, j] : joined) out.plan.nodes[i++].agent = claim;
  for (int claim = 0; claim < num_nodes; ++claim) {
    if (joined.count(claim)) continue;
    NodePlan spare;
    spare.agent = claim;
    spare.node_rank = spare.first_rank = -1;
    spare.host = "join-" + std::to_string(claim);
    const int n = options.num_gpus > 0 ? options.num_gpus : 1;
    for (int s = 0; s < n; ++s) spare.slots.push_back(s);
    out.plan.spares.push_back(std::move(spare));
  }
  const JoinedAgent& node0 = joined.begin()->second;
  // Node 0's address as it reached us: the pods' network.
  if (out.plan.master_addr.empty()) {
    out.plan.master_addr = node0.addr;
    // Node 0 reached us over loopback (the launcher runs in its pod):
    // other nodes cannot rendezvous there.
    bool remote = false;
    for (const auto& [node, j] : joined) remote = remote || !Loopback(j.addr);
    if (Loopback(node0.addr) && remote) {
      out.warning =
          "node 0 joined over loopback (" + node0.addr +
          "), which the other nodes cannot reach as MASTER_ADDR; pass "
          "--master_addr with node 0's address on their network";
    }
  }
  if (!master_port_given && node0.free_port > 0 && node0.free_port <= 65535)
    out.plan.master_port = node0.free_port;
  return out;
}

}  // namespace dslaunch::launcher
