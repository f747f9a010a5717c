// --launcher join (design section 9): the Job's side of agents that come to
// it. Until every node has joined it says who is missing; then it makes the
// plan from the agents (their hostnames and GPU counts) and sends the job.
#include <spdlog/spdlog.h>

#include "launcher/plan/hostfile.h"  // kMaxSlotsPerHost, kMaxTotalSlots
#include "launcher/report/report.h"
#include "launcher/supervise/job.h"
#include "proto/host_info.h"  // CpuListString
#include "proto/progress.h"   // EscapeControlChars

namespace dslaunch::launcher {

std::string Job::MissingNodes() const {
  std::vector<int> missing;
  for (size_t n = 0; n < plan_.nodes.size(); ++n) {
    if (!joined_.count(static_cast<int>(n)))
      missing.push_back(static_cast<int>(n));
  }
  return proto::CpuListString(missing);  // "1,3-5,7": short for many
}

void Job::ArmJoinWaitTimer() {
  const auto waited = std::chrono::duration_cast<std::chrono::seconds>(
      Clock::now() - start_time_);
  const int64_t left =
      static_cast<int64_t>(options_.start_timeout_s) - waited.count();
  console_.Note("waiting for agents to join on port " +
                std::to_string(control_port_) + ": " +
                std::to_string(joined_.size()) + " of " +
                std::to_string(plan_.nodes.size()) + " joined, missing " +
                MissingNodes() + " (" +
                std::to_string(std::max<int64_t>(left, 0)) + " s left)");
  join_wait_timer_.expires_after(std::chrono::seconds(5));
  join_wait_timer_.async_wait([this](const boost::system::error_code& ec) {
    if (ec || state_.phase() != Phase::kStarting ||
        joined_.size() == plan_.nodes.size())
      return;
    ArmJoinWaitTimer();
  });
}

void Job::OnNodeJoined(int node_rank, const wire::Hello& hello,
                       const std::string& agent_addr) {
  joined_[node_rank] = Joined{hello.facts(), agent_addr};
  if (joined_.size() < plan_.nodes.size()) return;
  join_wait_timer_.cancel();
  StartJoinedJob();
}

bool Job::OnJoinedNodeLeft(int node_rank, const Status& why) {
  // Once every node joined the job is planned and sent: a node lost from
  // then on is lost as under every start mode.
  const auto it = joined_.find(node_rank);
  if (it == joined_.end() || joined_.size() == plan_.nodes.size() ||
      !state_.NodeLeftBeforeStart(node_rank))
    return false;
  const std::string host = proto::EscapeForLog(
      it->second.facts.hostname().empty() ? it->second.addr
                                          : it->second.facts.hostname(),
      255);
  joined_.erase(it);
  console_.Note("node " + std::to_string(node_rank) + " (" + host +
                ") left before the job started (" +
                (why.ok() ? std::string("closed") : why.message()) +
                "); waiting for an agent to join as node " +
                std::to_string(node_rank) + " again");
  return true;
}

// The joined agents hear why (an Abort with the exit status) before the
// launcher ends: none waits for a job that will not come.
void Job::FailJoinedStart(const Status& why) {
  console_.Note(why.message());
  state_.StartFailed(why);
  wire::Envelope env;
  env.mutable_abort()->set_reason(why.message());
  env.mutable_abort()->set_kill_now(true);
  env.mutable_abort()->set_exit_status(state_.ExitStatus());
  SendToAll(env);
  links_->Shutdown();  // closes each connection once the Abort is out
  stop_timer_.expires_after(std::chrono::milliseconds(200));
  stop_timer_.async_wait(
      [this](const boost::system::error_code&) { io_.stop(); });
}

void Job::StartJoinedJob() {
  std::vector<std::string> hosts;
  std::vector<int> slots;
  int64_t world = 0;
  for (const auto& [node, j] : joined_) {
    // What agents say of themselves reaches the terminal escaped.
    hosts.push_back(proto::EscapeForLog(
        j.facts.hostname().empty() ? j.addr : j.facts.hostname(), 255));
    // --num_gpus, else the node's GPUs, else one rank.
    const int gpus = j.facts.gpus_size();
    if (options_.plan.num_gpus <= 0 && gpus > kMaxSlotsPerHost) {
      return FailJoinedStart(InvalidArgument(
          "node " + std::to_string(node) + " (" + hosts.back() + ") reports " +
          std::to_string(gpus) + " GPUs, more than " +
          std::to_string(kMaxSlotsPerHost) + " per node; --num_gpus sets it"));
    }
    slots.push_back(options_.plan.num_gpus > 0 ? options_.plan.num_gpus
                    : gpus > 0                 ? gpus
                                               : 1);
    world += slots.back();
  }
  if (world > kMaxTotalSlots) {
    return FailJoinedStart(InvalidArgument(std::to_string(world) +
                                           " ranks in all, more than " +
                                           std::to_string(kMaxTotalSlots)));
  }
  Plan plan = JoinPlan(hosts, slots, options_.plan);
  // Node 0's address as it reached us: the pods' network.
  if (plan.master_addr.empty()) {
    plan.master_addr = joined_.at(0).addr;
    // Node 0 reached us over loopback (the launcher runs in its pod):
    // other nodes cannot rendezvous there.
    const bool loopback =
        plan.master_addr.rfind("127.", 0) == 0 || plan.master_addr == "::1";
    bool remote = false;
    for (const auto& [node, j] : joined_) {
      remote = remote || (j.addr.rfind("127.", 0) != 0 && j.addr != "::1");
    }
    if (loopback && remote) {
      console_.Note(
          "node 0 joined over loopback (" + plan.master_addr +
          "), which the other nodes cannot reach as MASTER_ADDR; pass "
          "--master_addr with node 0's address on their network");
    }
  }
  const int port = joined_.at(0).facts.free_port();
  if (!options_.master_port_given && port > 0 && port <= 65535)
    plan.master_port = port;
  plan_ = std::move(plan);
  state_.Replan(plan_);
  if (on_plan_final_) {
    if (Status st = on_plan_final_(plan_); !st.ok()) return FailJoinedStart(st);
  }
  console_.Note(
      (plan_.nodes.size() == 1
           ? std::string("the agent joined: ")
           : "all " + std::to_string(plan_.nodes.size()) + " agents joined: ") +
      Plural(static_cast<size_t>(plan_.world_size), "rank") + ", MASTER_ADDR " +
      plan_.master_addr + ":" + std::to_string(plan_.master_port) +
      " (node 0, " + plan_.nodes[0].host + ")");
  master_port_known_ = true;
  for (size_t n = 0; n < plan_.nodes.size(); ++n)
    SendJobSpec(static_cast<int>(n));
}

}  // namespace dslaunch::launcher
