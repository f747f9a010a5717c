// JobStop: the Job's part that stops agents and ends the job. It carries out
// the JobState's actions: an Abort to every agent with ranks (they SIGTERM
// them, SIGKILL after --kill_grace; at once when killing), a Shutdown once
// every rank is done, and a kill for each agent started but never connected.
// It bounds the start (--start_timeout) and the stop: an agent that has not
// finished --kill_grace + 5 s after the stop began is killed, and 3 s later
// the job is given up. Agents on their way to a later generation (spares,
// agents started again) are left be while a restart is due. Owned by the
// Job; io_context thread only.
#pragma once

#include <boost/asio/io_context.hpp>
#include <boost/asio/steady_timer.hpp>
#include <functional>

#include "launcher/options.h"
#include "launcher/plan/plan.h"
#include "launcher/report/console.h"
#include "launcher/start/starter.h"
#include "launcher/state/job_state.h"
#include "launcher/supervise/control_server.h"
#include "launcher/supervise/restarts.h"

namespace dslaunch::launcher {

class JobStop {
 public:
  struct Hooks {
    // --start_timeout passed while the job was still starting.
    std::function<void()> start_timed_out;
    // The job ended: every part of it stops (the loop then ends).
    std::function<void()> ended;
  };

  // `pool`: every agent of the job by index (hosts for messages).
  JobStop(boost::asio::io_context& io, const LaunchOptions& options,
          Console& console, JobState& state, const Plan& pool,
          const Restarts& restarts, Hooks hooks);

  void Start(Starter* starter, AgentLinks* links);
  // What the JobState asks for: nothing, an Abort, a kill, a Shutdown.
  void Act(JobState::Action action);
  // To every agent that is in.
  void SendToAll(const wire::Envelope& msg);
  // A restart is due and every rank of the generation is gone: from now on
  // --rejoin_timeout bounds the wait for nodes, not the stop's timer (which
  // would end the job while an agent started again is on its way).
  void RestartDue();
  // Ends the job if its state says it has ended.
  void MaybeEnd();
  // Ends the job now; EndSoon gives what is queued for the agents (an Abort
  // saying why) a moment to go out first.
  void End();
  void EndSoon();

 private:
  void ArmStartTimer();
  void Abort(bool kill_now);
  void ShutdownAll();
  void KillUnconnected();
  void ArmStopTimer();

  boost::asio::io_context& io_;
  const LaunchOptions& options_;
  Console& console_;
  JobState& state_;
  const Plan& pool_;
  const Restarts& restarts_;
  Hooks hooks_;
  Starter* starter_ = nullptr;
  AgentLinks* links_ = nullptr;
  boost::asio::steady_timer start_timer_;
  boost::asio::steady_timer stop_timer_;
  bool stop_timer_armed_ = false;
};

}  // namespace dslaunch::launcher
