// JobState: the state of one job on the launcher, its phase transitions and
// what ended it (one Outcome). Pure bookkeeping without I/O: the Job feeds it
// what the agents, the starter and the user did, and acts on the answers.
// Owned by the Job; io_context thread only.
//
// A job that restarts (--max_restarts) runs generations: the JobState is
// the current one's, and keeps what ended each earlier one (history()).
//
// Phases and the only legal transitions (each logged once):
//   Starting -> Running    every rank started
//   Starting -> Stopping   a rank failed, a node was lost, an interrupt
//   Running  -> Stopping   the same, or every rank finished
//   Starting -> Ended      the start failed: nothing was started
//   Stopping -> Ended      every agent finished, or was given up on after it
//                          was killed past the grace period
//   Stopping -> Starting   the next generation: a restart was due and every
//                          agent ended its ranks and waits (idle)
//
// "node" below is an agent: its index among the job's hosts (NodePlan::agent,
// spares last), fixed for the job. A generation's members are the agents
// that run its ranks, under node ranks of their own (GenerationPlan); the
// others stand by, idle.
#pragma once

#include <chrono>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "base/status.h"
#include "launcher/plan/plan.h"

namespace dslaunch::launcher {

enum class Phase { kStarting, kRunning, kStopping, kEnded };
const char* PhaseName(Phase phase);
bool IsLegalTransition(Phase from, Phase to);

using Clock = std::chrono::steady_clock;

// What ended the job. The first cause wins, except that a rank failure that
// happened earlier (by its agent's clock) than the recorded one replaces it:
// a peer that failed because the first rank died may be heard of first. A
// rank ended by SIGTERM or SIGKILL never replaces one (our stop sends those).
struct Outcome {
  enum class Cause {
    kNone,         // still running
    kSucceeded,    // every rank exited 0
    kRankFailed,   // rank `rank` on node `node` exited non-zero or by signal
    kNodeLost,     // node `node`'s agent was lost (`reason` says how)
    kInterrupted,  // the user (or the batch system) sent `signal`
    kStartFailed,  // nothing started: `start_status` says why
    kHung,         // rank `rank` made no progress (--on_hang abort)
    // --num_nodes MIN:MAX: a generation below MAX stops so that the next
    // one runs on the nodes that came back (`reason` names them). Spends
    // no restart of the --max_restarts budget; never the job's end.
    kGrow,
  };
  Cause cause = Cause::kNone;
  int rank = -1;
  int node = -1;
  int exit_code = 0;
  int signal = 0;
  double exit_time = 0;    // kRankFailed: wall-clock seconds its agent stamped
  std::string reason;      // one sentence for the report
  std::string stopped_by;  // kInterrupted from outside: who and why
  std::string no_restart;  // why a restart that was due did not happen
  Status start_status;     // kStartFailed
  Clock::time_point when{};
};
const char* CauseName(Outcome::Cause cause);

// The launcher's exit status for an outcome: 0 when every rank exited 0; a
// failed rank's code (128 + signal when killed); 69 for a lost node; 130
// after Ctrl-C, 128 + the signal after another (143: SIGTERM, a
// preemption), also when the batch system stopped the job; 124 for
// --on_hang abort; the start's Status mapped by
// ExitStatusFor(Status) when nothing started.
int ExitStatusFor(const Outcome& outcome);

struct RankRecord {
  int node_rank = 0;  // its agent (NodePlan::agent), not the node rank
  int pid = 0;
  bool started = false;
  bool exited = false;
  int exit_code = 0;
  int signal = 0;
  std::string error;     // the agent could not start it
  double exit_time = 0;  // the agent's wall clock
  bool stopped = false;  // it ended of our stop (the agent had signalled it)
  Clock::time_point exited_at{};
  bool failed() const { return exited && (signal != 0 || exit_code != 0); }
};

struct NodeRecord {
  bool member = false;  // runs ranks in this generation
  bool authenticated = false;
  // It runs no rank and waits for a generation: a member whose ranks are
  // gone, a spare, a lost node's new agent.
  bool idle = false;
  int losses = 0;               // times its agent was lost
  Clock::time_point lost_at{};  // the last time
  // Lost twice within --node_cooldown: not started again before this.
  Clock::time_point excluded_until{};
  bool disconnected = false;    // its control connection ended
  bool process_exited = false;  // the starter saw its agent process end
  bool done = false;  // its agent said AgentDone (every rank's end reported)
  // Its agent ran a generation where agents run one each (mpirun's): it
  // runs no other, and its end is no loss that counts for --node_cooldown.
  bool spent = false;
  std::string lost_reason;  // set once when the node is lost
  std::string address;      // its agent's control connection's peer
  // Finished: nothing of it runs any more, as far as the launcher can tell.
  bool finished() const {
    return process_exited && (disconnected || !authenticated);
  }
};

// One generation that ended in a restart (or whose restart an interrupt
// called off): what ended it, and where it ran.
struct Generation {
  int restart_count = 0;  // 0: the first
  Outcome outcome;
  std::vector<std::string> hosts;  // its nodes, by node rank
  Clock::time_point started{};
  Clock::time_point stopped{};  // when the outcome was decided
  Clock::time_point ended{};    // every agent idle (or the restart called off)
};

class JobState {
 public:
  // What the Job must do after an event.
  enum class Action {
    kNone,
    kAbortAll,     // graceful stop of every rank (SIGTERM, SIGKILL after grace)
    kKillAll,      // SIGKILL every rank now
    kShutdownAll,  // every rank is done: tell the agents to exit
  };

  // `plan`: the first generation's (its spares stand by). `max_restarts`:
  // how many generations may follow a failed one; a node lost again within
  // `node_cooldown_s` of its last loss is excluded for that long.
  explicit JobState(const Plan& plan, int max_restarts = 0,
                    double node_cooldown_s = 600);
  // Agents run one generation each (a start mode's each_generation_starts):
  // a generation's members are spent (NodeRecord::spent) when it starts.
  void SetAgentsRunOneGeneration() {
    one_generation_agents_ = true;
    for (auto& n : nodes_) n.spent = n.spent || n.member;
  }

  Phase phase() const { return phase_; }
  const Outcome& outcome() const { return outcome_; }
  const std::map<int, RankRecord>& ranks() const { return ranks_; }
  const std::vector<NodeRecord>& nodes() const { return nodes_; }
  const NodeRecord& node(int n) const { return nodes_.at(n); }
  Clock::time_point stop_time() const { return stop_time_; }
  Clock::time_point end_time() const { return end_time_; }
  Clock::time_point generation_start() const { return generation_start_; }
  // When the agents were first started (Launched).
  Clock::time_point launch_time() const { return launch_time_; }
  void Launched() { launch_time_ = generation_start_ = Clock::now(); }

  // Generations: restarts so far (the current generation's number: every
  // generation after the first, whatever its cause) and the ones that ended
  // before it. Those after a failure spend the --max_restarts budget; those
  // that grew the job (kGrow) do not.
  int restarts() const { return restarts_; }
  int failure_restarts() const { return failure_restarts_; }
  int max_restarts() const { return max_restarts_; }
  // The agents of this generation's ranks.
  int members() const;
  const std::vector<Generation>& history() const { return history_; }
  // The stop under way ends in a restart: its cause was a rank's failure, a
  // hang or a lost node (an interrupt, a stop from outside, success: never),
  // restarts are left, and nothing called it off. What the Abort tells the
  // agents. A node lost meanwhile is waited for (Job: started again).
  bool restart_pending() const { return restart_pending_; }
  // node's agent is being started again (it was lost): not finished.
  void NodeRestarting(int node);
  // node's agent said AgentDone; its connection's peer address.
  void NodeDone(int node) { nodes_.at(node).done = true; }
  void NodeAddress(int node, std::string address) {
    nodes_.at(node).address = std::move(address);
  }
  // The nodes lost and not back: "host (why)" each.
  std::vector<std::string> MissingNodes() const;
  // Every node not lost has ended its ranks and waits.
  bool OthersIdle() const;
  // Agents that could run the next generation: connected, idle, not lost,
  // not excluded by the cooldown, not spent. Ascending.
  std::vector<int> ReadyAgents() const;
  // A node that is not lost, not excluded, and stands by while the current
  // generation runs on fewer nodes than `max_nodes`: it could grow the job.
  bool CanGrow(int max_nodes) const;
  // The lost nodes did not come back in time (--rejoin_timeout) or cannot
  // (--node_cooldown): the job ends, 69, naming them (`why`). The failure
  // that was to be restarted goes to history().
  void GiveUpRejoin(const std::string& why);
  // The agent of `node` ended its ranks of this generation and waits.
  Status NodeIdle(int node);
  // A restart is due and every node not lost is idle: the next generation
  // can start, on ReadyAgents() (the Job chooses how many).
  bool ReadyToRestart() const;
  // Calls a pending restart off (a node was lost meanwhile): the stop ends
  // the job. `why` goes to the outcome's no_restart.
  void CallOffRestart(const std::string& why);
  // Stopping -> Starting: the current generation goes to history(); `plan`
  // is the next one's (its nodes' agents among ReadyAgents()), every rank
  // of it pending. Only when ReadyToRestart().
  void NextGeneration(const Plan& plan);
  // Running -> Stopping with a restart that spends no budget (kGrow): nodes
  // stand by that the generation could use (`why` names them). False when
  // nothing changed (not running, an interrupt came first).
  bool Grow(const std::string& why);

  // Events from agents. Invalid ones (unknown rank or node, a rank's start
  // or exit from another node, or repeated) return a non-OK Status and change
  // nothing; a repeated authentication is harmless and accepted.
  Status NodeAuthenticated(int node);
  StatusOr<Action> RankStarted(int node, int rank, int pid);
  // `stopped`: the agent had signalled the rank while it ran (its end is a
  // consequence of a stop, never the cause).
  StatusOr<Action> RankExited(int node, int rank, int exit_code, int signal,
                              double exit_time, std::string error,
                              bool stopped = false);
  // The node's connection ended; a node with ranks still running is lost,
  // and so is one that stands by while the job runs or restarts (it is
  // started again, but stops nothing).
  Action NodeDisconnected(int node, const std::string& why);
  // The starter saw the agent process end; lost if it never connected.
  Action AgentProcessExited(int node, const std::string& how);
  // A member's loss stops the generation; another node's is only noted.
  Action NodeLost(int node, const std::string& why);
  // SIGINT/SIGTERM/SIGHUP: the first stops gracefully, a second kills.
  Action Interrupted(int signal);
  // Something outside dslaunch stopped the job: the batch system (`why`:
  // "SLURM cancelled step 12.0 (scancel)"), or whoever signalled an agent.
  // As a first interrupt; after an interrupt it only names the cause more
  // precisely (SLURM signals the agents, us, and says it cancelled the
  // step, in any order).
  Action StoppedFromOutside(int signal, const std::string& why);
  // --on_hang abort: `rank` sent no progress record for too long.
  Action Hung(int rank, const std::string& why);
  // --launcher join, while the job is still assembling (starting, no rank
  // started): the node's agent left; the node is free for the next agent
  // that joins as it. False (nothing changed) otherwise.
  bool NodeLeftBeforeStart(int node);
  // The starter failed before anything ran: Starting -> Ended.
  void StartFailed(const Status& why);
  // --launcher join, once every node joined: the final plan (the agents'
  // hosts and slot counts). Only while starting, before any rank started.
  void Replan(const Plan& plan);
  // Stopping -> Ended once every node finished and no restart is due; true
  // when that happened now.
  bool MaybeEnd();
  // Stopping -> Ended although some agent never confirmed its end (it was
  // killed after the grace period and still did not answer).
  void GiveUp();
  bool gave_up() const { return gave_up_; }

  bool AllNodesFinished() const;
  int interrupts() const { return interrupts_; }
  int ExitStatus() const { return ExitStatusFor(outcome_); }

 private:
  void SetPhase(Phase next);
  // Records `outcome` when none is recorded, and starts stopping.
  bool Decide(Outcome outcome);
  // An interrupt while a restart is due: the failure goes to history() as
  // its generation's end, and the interrupt is the job's outcome.
  void InterruptRestart(Outcome interrupt);
  Generation CurrentGeneration() const;
  bool NodeHasRunningRanks(int node) const;
  void SetRanks(const Plan& plan);

  bool one_generation_agents_ = false;
  Phase phase_ = Phase::kStarting;
  Outcome outcome_;
  std::map<int, RankRecord> ranks_;
  std::vector<NodeRecord> nodes_;
  std::vector<std::string> hosts_;
  size_t started_ = 0;
  size_t exited_ = 0;
  int interrupts_ = 0;
  bool gave_up_ = false;
  int max_restarts_ = 0;
  Clock::duration node_cooldown_{};
  int restarts_ = 0;
  int failure_restarts_ = 0;
  bool restart_pending_ = false;
  std::vector<Generation> history_;
  Clock::time_point generation_start_ = Clock::now();
  Clock::time_point launch_time_ = generation_start_;
  Clock::time_point all_idle_at_{};  // every agent idle: its ranks gone
  Clock::time_point stop_time_{};
  Clock::time_point end_time_{};
};

}  // namespace dslaunch::launcher
