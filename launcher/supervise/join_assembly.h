// JoinAssembly: --launcher join's side of a job that is still assembling.
// Agents come to the launcher and claim node ranks; until every node has
// one, a line every 5 s says which are missing, and a node whose agent left
// is free again for the next agent that joins as it. Once every node has
// joined (--num_nodes MIN:MAX: MAX, or at least MIN and no other came for
// --join_settle) it makes the plan from them (plan/joined_plan) and hands
// it on.
// Owned by the Job; io_context thread only.
#pragma once

#include <boost/asio/io_context.hpp>
#include <boost/asio/steady_timer.hpp>
#include <functional>
#include <map>
#include <string>

#include "launcher/options.h"
#include "launcher/plan/joined_plan.h"
#include "launcher/report/console.h"
#include "launcher/state/job_state.h"
#include "proto/dslaunch.pb.h"

namespace dslaunch::launcher {

class JoinAssembly {
 public:
  // Every node joined: the plan made from them, or why there is none.
  using Complete = std::function<void(StatusOr<JoinedPlan>)>;

  JoinAssembly(boost::asio::io_context& io, const LaunchOptions& options,
               Console& console, const JobState& state, int num_nodes,
               Complete complete);

  // Says every 5 s, while the job assembles, who is missing; `start` is
  // when the wait began (--join_timeout counts from there).
  void Start(int control_port, Clock::time_point start);
  void OnJoined(int node_rank, const wire::Hello& hello,
                const std::string& agent_addr);
  // Whether node_rank's agent joined and the job is still assembling: if
  // it leaves now its node is free again (Left), else it is lost as under
  // every start mode.
  bool Assembling(int node_rank) const;
  void Left(int node_rank, const Status& why);
  // --join_timeout passed: the line that names the missing nodes.
  void SayTimedOut() const;
  // Called with the plan made from the agents once the Job has taken it,
  // before any JobSpec goes out (the console opens the new ranks' logs);
  // an error stops the job.
  void SetOnPlanFinal(std::function<Status(const Plan&)> f) {
    on_plan_final_ = std::move(f);
  }
  Status PlanFinal(const Plan& plan) const {
    return on_plan_final_ ? on_plan_final_(plan) : Status::Ok();
  }
  void Stop();

 private:
  // "1,3-5": the node ranks no agent has joined as yet.
  std::string MissingNodes() const;
  void Finish();
  void SayMissing();

  const LaunchOptions& options_;
  Console& console_;
  const JobState& state_;
  const size_t num_nodes_;
  Complete complete_;
  std::function<Status(const Plan&)> on_plan_final_;
  boost::asio::steady_timer timer_;
  boost::asio::steady_timer settle_;  // MIN joined: --join_settle runs
  bool done_ = false;
  int control_port_ = 0;
  Clock::time_point start_{};
  std::map<int, JoinedAgent> joined_;
};

}  // namespace dslaunch::launcher
