#include "launcher/supervise/join_assembly.h"

#include <algorithm>  // max

#include "base/host_info.h"  // CpuListString
#include "base/unix_time.h"
#include "proto/progress.h"  // EscapeForLog

namespace dslaunch::launcher {

JoinAssembly::JoinAssembly(boost::asio::io_context& io,
                           const LaunchOptions& options, Console& console,
                           const JobState& state, int num_nodes,
                           Complete complete)
    : options_(options),
      console_(console),
      state_(state),
      num_nodes_(static_cast<size_t>(num_nodes)),
      complete_(std::move(complete)),
      timer_(io),
      settle_(io) {}

void JoinAssembly::Start(int control_port, Clock::time_point start) {
  control_port_ = control_port;
  start_ = start;
  SayMissing();
}

void JoinAssembly::Stop() {
  timer_.cancel();
  settle_.cancel();
}

std::string JoinAssembly::MissingNodes() const {
  std::vector<int> missing;
  for (size_t n = 0; n < num_nodes_; ++n) {
    if (!joined_.count(static_cast<int>(n)))
      missing.push_back(static_cast<int>(n));
  }
  return base::CpuListString(missing);  // "1,3-5,7": short for many
}

void JoinAssembly::SayMissing() {
  const auto waited =
      std::chrono::duration_cast<std::chrono::seconds>(Clock::now() - start_);
  const int64_t left =
      static_cast<int64_t>(options_.start_timeout_s) - waited.count();
  console_.Note(
      "waiting for agents to join on port " + std::to_string(control_port_) +
      ": " + std::to_string(joined_.size()) + " of " +
      std::to_string(num_nodes_) + " joined, missing " + MissingNodes() + " (" +
      std::to_string(std::max<int64_t>(left, 0)) + " s left)");
  timer_.expires_after(std::chrono::seconds(5));
  timer_.async_wait([this](const boost::system::error_code& ec) {
    if (ec || state_.phase() != Phase::kStarting || done_) return;
    SayMissing();
  });
}

void JoinAssembly::SayTimedOut() const {
  console_.Note("--join_timeout: no agent joined as node rank" +
                std::string(joined_.size() + 1 < num_nodes_ ? "s " : " ") +
                MissingNodes() + " within " +
                std::to_string(static_cast<int>(options_.start_timeout_s)) +
                " s");
}

void JoinAssembly::OnJoined(int node_rank, const wire::Hello& hello,
                            const std::string& agent_addr) {
  const wire::NodeFacts& f = hello.facts();
  joined_[node_rank] =
      JoinedAgent{f.hostname(), f.gpus_size(), f.free_port(), agent_addr};
  if (joined_.size() >= num_nodes_) return Finish();
  const int min = options_.plan.min_nodes;
  if (min <= 0 || joined_.size() < static_cast<size_t>(min)) return;
  // At least MIN: the job starts unless another agent joins meanwhile.
  settle_.expires_after(base::Millis(options_.join_settle_s));
  settle_.async_wait([this, min](const boost::system::error_code& ec) {
    if (ec || done_ || state_.phase() != Phase::kStarting ||
        joined_.size() < static_cast<size_t>(min))
      return;
    console_.Note("starting with " + std::to_string(joined_.size()) + " of " +
                  std::to_string(num_nodes_) +
                  " nodes: no other agent joined for " + "--join_settle " +
                  std::to_string(static_cast<int64_t>(options_.join_settle_s)) +
                  " s (missing " + MissingNodes() +
                  "; each joins the job when it comes)");
    Finish();
  });
}

void JoinAssembly::Finish() {
  done_ = true;
  timer_.cancel();
  settle_.cancel();
  complete_(PlanFromJoinedAgents(joined_, options_.plan,
                                 options_.master_port_given,
                                 static_cast<int>(num_nodes_)));
}

bool JoinAssembly::Assembling(int node_rank) const {
  return !done_ && joined_.count(node_rank);
}

void JoinAssembly::Left(int node_rank, const Status& why) {
  const auto it = joined_.find(node_rank);
  if (it == joined_.end()) return;
  const std::string host = proto::EscapeForLog(
      it->second.hostname.empty() ? it->second.addr : it->second.hostname, 255);
  joined_.erase(it);
  console_.Note("node " + std::to_string(node_rank) + " (" + host +
                ") left before the job started (" +
                (why.ok() ? std::string("closed") : why.message()) +
                "); waiting for an agent to join as node " +
                std::to_string(node_rank) + " again");
}

}  // namespace dslaunch::launcher
