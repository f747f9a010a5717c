#include "launcher/supervise/job_stop.h"

#include <spdlog/spdlog.h>

#include "base/unix_time.h"

namespace dslaunch::launcher {

JobStop::JobStop(boost::asio::io_context& io, const LaunchOptions& options,
                 Console& console, JobState& state, const Plan& pool,
                 const Restarts& restarts, Hooks hooks)
    : io_(io),
      options_(options),
      console_(console),
      state_(state),
      pool_(pool),
      restarts_(restarts),
      hooks_(std::move(hooks)),
      start_timer_(io),
      stop_timer_(io) {}

void JobStop::Start(Starter* starter, AgentLinks* links) {
  starter_ = starter;
  links_ = links;
  ArmStartTimer();
}

void JobStop::ArmStartTimer() {
  start_timer_.expires_after(base::Millis(options_.start_timeout_s));
  start_timer_.async_wait([this](const boost::system::error_code& ec) {
    if (!ec && state_.phase() == Phase::kStarting) hooks_.start_timed_out();
  });
}

void JobStop::Act(JobState::Action action) {
  switch (action) {
    case JobState::Action::kNone:
      return;
    case JobState::Action::kAbortAll:
      return Abort(false);
    case JobState::Action::kKillAll:
      return Abort(true);
    case JobState::Action::kShutdownAll:
      return ShutdownAll();
  }
}

void JobStop::SendToAll(const wire::Envelope& msg) {
  for (size_t n = 0; n < state_.nodes().size(); ++n) {
    if (state_.node(static_cast<int>(n)).authenticated)
      (void)links_->Send(static_cast<int>(n), msg);
  }
}

void JobStop::ShutdownAll() {
  ArmStopTimer();
  wire::Envelope env;
  env.mutable_shutdown();
  SendToAll(env);
  KillUnconnected();
}

void JobStop::KillUnconnected() {
  for (size_t n = 0; n < state_.nodes().size(); ++n) {
    const int agent = static_cast<int>(n);
    const NodeRecord& node = state_.node(agent);
    if (node.authenticated || node.process_exited) continue;
    // A restart is due: spares and agents started again stay.
    if (state_.restart_pending() &&
        (!node.member || restarts_.StartingAgain(agent)))
      continue;
    starter_->Kill(agent);
  }
}

void JobStop::Abort(bool kill_now) {
  ArmStopTimer();
  spdlog::info("stopping: {}", state_.outcome().reason);
  wire::Envelope env;
  env.mutable_abort()->set_reason(state_.outcome().reason);
  env.mutable_abort()->set_kill_now(kill_now);
  env.mutable_abort()->set_exit_status(state_.ExitStatus());
  env.mutable_abort()->set_restart(state_.restart_pending());
  if (state_.restart_pending()) {
    console_.Note(state_.outcome().reason + "; stopping every rank, then " +
                  RestartName(state_,
                              state_.outcome().cause == Outcome::Cause::kGrow,
                              1));
  }
  // Agents standing by have no ranks to stop: an Abort that restarts
  // leaves them be, one that ends the job ends them.
  for (size_t n = 0; n < state_.nodes().size(); ++n) {
    const NodeRecord& node = state_.node(static_cast<int>(n));
    if (node.authenticated && (node.member || !state_.restart_pending()))
      (void)links_->Send(static_cast<int>(n), env);
  }
  KillUnconnected();
  MaybeEnd();
}

void JobStop::ArmStopTimer() {
  start_timer_.cancel();
  // The job ends (no restart is due, or it was called off): what the
  // starter started may end with it.
  if (starter_ && !state_.restart_pending()) starter_->Stopping();
  if (stop_timer_armed_) return;
  stop_timer_armed_ = true;
  // Agents SIGKILL their workers after the grace period; one that still has
  // not finished well after that is killed itself.
  stop_timer_.expires_after(base::Millis(options_.kill_grace_s + 5));
  stop_timer_.async_wait([this](const boost::system::error_code& ec) {
    if (ec) return;
    for (size_t n = 0; n < state_.nodes().size(); ++n) {
      const int node = static_cast<int>(n);
      if (state_.node(node).finished() || state_.node(node).idle) continue;
      if (state_.restart_pending() && restarts_.StartingAgain(node)) continue;
      console_.Note("agent of node " + std::to_string(node) + " (" +
                    pool_.nodes[node].host +
                    ") did not stop in time; killing it");
      starter_->Kill(node);
    }
    stop_timer_.expires_after(std::chrono::seconds(3));
    stop_timer_.async_wait([this](const boost::system::error_code& ec) {
      if (ec) return;
      state_.GiveUp();
      End();
    });
  });
}

void JobStop::RestartDue() {
  stop_timer_.cancel();
  stop_timer_armed_ = false;
}

void JobStop::MaybeEnd() {
  if (state_.MaybeEnd()) End();
}

void JobStop::End() {
  start_timer_.cancel();
  stop_timer_.cancel();
  hooks_.ended();
  links_->Shutdown();
  io_.stop();
}

void JobStop::EndSoon() {
  start_timer_.cancel();
  links_->Shutdown();  // closes each connection once what is queued is out
  stop_timer_.expires_after(std::chrono::milliseconds(200));
  stop_timer_.async_wait(
      [this](const boost::system::error_code&) { io_.stop(); });
}

}  // namespace dslaunch::launcher
