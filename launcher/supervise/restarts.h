// Restarts: the Job's part that keeps a restarting job (--max_restarts)
// supplied with nodes. It starts lost nodes' agents again where the start
// mode can (not while --node_cooldown excludes them; again every few seconds
// while they fail), at any time while the job lives, so that a node back
// can grow a generation that runs below --num_nodes MAX. When a restart is
// due and every other node has ended its ranks, it chooses the next
// generation's agents:
//   - MAX ready agents (spares take lost nodes' places): at once;
//   - at least MIN: once no further agent became ready for --join_settle,
//     or when no lost node can come back;
//   - fewer than MIN for --rejoin_timeout, or when none can come back: the
//     job ends 69 naming the missing nodes;
// then waits --restart_backoff and hands them to the Job. Where agents make
// their own secrets (pdsh, srun) a lost node's agent is started again only
// while no rank runs, and the next generation waits until its secret is
// spent. Owned by the Job;
// io_context thread only.
#pragma once

#include <boost/asio/io_context.hpp>
#include <boost/asio/steady_timer.hpp>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "launcher/options.h"
#include "launcher/plan/plan.h"
#include "launcher/report/console.h"
#include "launcher/start/starter.h"
#include "launcher/state/job_state.h"

namespace dslaunch::launcher {

// "restart 2 of 3" (the --max_restarts budget), with the generation's
// number where grows made them differ; a grow spends nothing. `ahead`: 1 for
// the restart to come, 0 for the one just made.
std::string RestartName(const JobState& state, bool grow, int ahead);

class Restarts {
 public:
  struct Hooks {
    // Not enough nodes: the restart is off and the job ends (`why`).
    std::function<void(const std::string& why)> give_up;
    // The next generation runs on `agents` (ascending).
    std::function<void(const std::vector<int>& agents)> start_generation;
    // A node stands by that a generation below MAX could use: stop every
    // rank for a restart that grows the job (`why`).
    std::function<void(const std::string& why)> grow;
    // The agent is about to be started again.
    std::function<void(int agent)> starting_again;
    // The agent ran its one generation (NodeRecord::spent) and waits: tell
    // it to end, so that the start mode can start a new one.
    std::function<void(int agent)> retire;
  };

  // `pool`: every agent of the job by index (hosts for messages);
  // min_nodes..max_nodes: how many a generation runs on.
  Restarts(boost::asio::io_context& io, const LaunchOptions& options,
           Console& console, JobState& state, const Plan& pool, int min_nodes,
           int max_nodes, Hooks hooks);

  void SetStarter(Starter* starter) { starter_ = starter; }
  // After any event that may change what is due: a node lost, back, idle.
  void Tend();
  // The agent's connection ended: an attempt to start it again is over.
  void Disconnected(int agent) { started_again_.erase(agent); }
  // Its agent is being started again for a later generation (a stop must
  // not kill it on its way).
  bool StartingAgain(int agent) const { return started_again_.count(agent); }
  // The agent's free TCP port (its Hello, its GenerationEnded): the next
  // MASTER_PORT when it becomes node 0.
  void NoteFreePort(int agent, int port);
  int FreePort(int agent) const;
  // The job ends: no more timers.
  void Stop();

 private:
  // Starts lost agents again where due. Whether a lost node may still come
  // back (within the rejoin timeout), and whether one is excluded.
  void ReviveLost(bool* may_return, bool* excluded);
  // Where agents run one generation each: once the restart is due, the
  // spent ones still connected are told to end (each once). Whether any
  // spent one is not lost yet (it will be, and comes back as a new one).
  bool RetireSpent();
  // A restart is due: the next generation's agents, a wait, or the end.
  void Decide(bool may_return, bool excluded);
  // Agents that make their own secrets (pdsh, srun): whether one may be
  // started again now; whether one started again has its secret unspent.
  bool SecretMayGoOut() const;
  bool SecretsOut() const;
  void TickIn(Clock::duration d);
  std::string Who(int agent) const;

  boost::asio::io_context& io_;
  const LaunchOptions& options_;
  Console& console_;
  JobState& state_;
  const Plan& pool_;
  const size_t min_nodes_, max_nodes_;
  Hooks hooks_;
  Starter* starter_ = nullptr;
  boost::asio::steady_timer tick_;     // while nodes are lost or waited for
  boost::asio::steady_timer backoff_;  // --restart_backoff
  bool backoff_armed_ = false;
  bool going_ = false;  // the next generation is due: no more agents started
  bool stopped_ = false;
  Clock::time_point wait_since_{};    // every other node idle: from then on
  Clock::time_point settle_since_{};  // the last agent that became ready
  size_t ready_seen_ = 0;
  std::map<int, Clock::time_point> started_again_;  // agent -> last attempt
  std::map<int, int> free_ports_;                   // agent -> port
  std::map<int, Clock::time_point> retired_;        // agent -> told to end
  // A spent agent disconnected whose process has not ended yet: since when
  // (it gets some seconds to end on its own before it is killed).
  std::map<int, Clock::time_point> ending_since_;
};

}  // namespace dslaunch::launcher
