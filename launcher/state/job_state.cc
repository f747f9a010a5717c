#include "launcher/state/job_state.h"

#include <signal.h>
#include <spdlog/spdlog.h>

#include <algorithm>  // sort

#include "base/exit_status.h"

namespace dslaunch::launcher {

namespace {

struct Transition {
  Phase from, to;
};
// The whole table; anything else is a bug.
constexpr Transition kTransitions[] = {
    {Phase::kStarting, Phase::kRunning}, {Phase::kStarting, Phase::kStopping},
    {Phase::kRunning, Phase::kStopping}, {Phase::kStarting, Phase::kEnded},
    {Phase::kStopping, Phase::kEnded},   {Phase::kStopping, Phase::kStarting},
};

}  // namespace

const char* PhaseName(Phase phase) {
  switch (phase) {
    case Phase::kStarting:
      return "Starting";
    case Phase::kRunning:
      return "Running";
    case Phase::kStopping:
      return "Stopping";
    case Phase::kEnded:
      return "Ended";
  }
  return "?";
}

bool IsLegalTransition(Phase from, Phase to) {
  for (const auto& t : kTransitions) {
    if (t.from == from && t.to == to) return true;
  }
  return false;
}

const char* CauseName(Outcome::Cause cause) {
  switch (cause) {
    case Outcome::Cause::kNone:
      return "none";
    case Outcome::Cause::kSucceeded:
      return "succeeded";
    case Outcome::Cause::kRankFailed:
      return "rank failed";
    case Outcome::Cause::kNodeLost:
      return "node lost";
    case Outcome::Cause::kInterrupted:
      return "interrupted";
    case Outcome::Cause::kStartFailed:
      return "start failed";
    case Outcome::Cause::kHung:
      return "hung";
    case Outcome::Cause::kGrow:
      return "grow";
  }
  return "?";
}

int ExitStatusFor(const Outcome& o) {
  switch (o.cause) {
    case Outcome::Cause::kSucceeded:
      return kExitOk;
    case Outcome::Cause::kRankFailed:
      return ExitStatusForProcess(o.exit_code, o.signal);
    case Outcome::Cause::kNodeLost:
      return kExitUnavailable;
    case Outcome::Cause::kInterrupted:
      // As a shell reports a process the signal ended: 130 after Ctrl-C,
      // 143 after SIGTERM (a preemption), 129 after SIGHUP.
      return o.signal > 0 ? ExitStatusForProcess(0, o.signal)
                          : kExitInterrupted;
    case Outcome::Cause::kStartFailed:
      return ExitStatusFor(o.start_status);
    case Outcome::Cause::kHung:
      return kExitHung;
    case Outcome::Cause::kNone:
    case Outcome::Cause::kGrow:  // never the job's end
      break;
  }
  return kExitSoftware;  // the job ended unaccounted: a bug
}

JobState::JobState(const Plan& plan, int max_restarts, double node_cooldown_s)
    : nodes_(plan.nodes.size() + plan.spares.size()),
      max_restarts_(max_restarts),
      node_cooldown_(std::chrono::duration_cast<Clock::duration>(
          std::chrono::duration<double>(node_cooldown_s))) {
  Replan(plan);
}

void JobState::Replan(const Plan& plan) {
  DSL_CHECK(phase_ == Phase::kStarting && started_ == 0 &&
            plan.nodes.size() + plan.spares.size() == nodes_.size());
  hosts_.assign(nodes_.size(), "");
  for (const auto& node : plan.nodes) hosts_.at(node.agent) = node.host;
  for (const auto& node : plan.spares) hosts_.at(node.agent) = node.host;
  SetRanks(plan);
}

// The generation's ranks, on its members' agents; the others stand by.
void JobState::SetRanks(const Plan& plan) {
  ranks_.clear();
  for (auto& n : nodes_) n.member = false;
  for (const auto& node : plan.nodes) {
    DSL_CHECK(node.agent >= 0 && node.agent < static_cast<int>(nodes_.size()));
    nodes_[node.agent].member = true;
    if (one_generation_agents_) nodes_[node.agent].spent = true;
    for (size_t i = 0; i < node.slots.size(); ++i)
      ranks_[node.first_rank + static_cast<int>(i)].node_rank = node.agent;
  }
}

int JobState::members() const {
  int n = 0;
  for (const auto& node : nodes_) n += node.member ? 1 : 0;
  return n;
}

void JobState::SetPhase(Phase next) {
  if (!IsLegalTransition(phase_, next)) {
    spdlog::critical("illegal job transition {} -> {}", PhaseName(phase_),
                     PhaseName(next));
    DSL_CHECK(IsLegalTransition(phase_, next));
  }
  spdlog::info("job {} -> {}", PhaseName(phase_), PhaseName(next));
  phase_ = next;
}

bool JobState::Decide(Outcome outcome) {
  if (outcome_.cause != Outcome::Cause::kNone) return false;
  if (phase_ != Phase::kStarting && phase_ != Phase::kRunning) return false;
  outcome.when = Clock::now();
  outcome_ = std::move(outcome);
  stop_time_ = outcome_.when;
  // A rank its agent could not start (no such program) fails the same way
  // in every generation: no restart is spent on it.
  const bool restartable = (outcome_.cause == Outcome::Cause::kRankFailed &&
                            ranks_.at(outcome_.rank).error.empty()) ||
                           outcome_.cause == Outcome::Cause::kHung ||
                           outcome_.cause == Outcome::Cause::kNodeLost;
  restart_pending_ =
      interrupts_ == 0 && (outcome_.cause == Outcome::Cause::kGrow ||
                           (restartable && failure_restarts_ < max_restarts_));
  SetPhase(Phase::kStopping);
  return true;
}

Generation JobState::CurrentGeneration() const {
  std::vector<std::string> hosts;
  std::map<int, int> first_rank;  // agent -> its first rank: node rank order
  for (const auto& [rank, r] : ranks_) first_rank.emplace(r.node_rank, rank);
  std::vector<std::pair<int, int>> order;
  for (const auto& [agent, rank] : first_rank) order.push_back({rank, agent});
  std::sort(order.begin(), order.end());
  for (const auto& [rank, agent] : order) hosts.push_back(hosts_[agent]);
  return {restarts_,
          outcome_,
          std::move(hosts),
          generation_start_,
          stop_time_,
          all_idle_at_ == Clock::time_point{} ? Clock::now() : all_idle_at_};
}

void JobState::InterruptRestart(Outcome interrupt) {
  history_.push_back(CurrentGeneration());
  restart_pending_ = false;
  interrupt.when = Clock::now();
  outcome_ = std::move(interrupt);
}

void JobState::CallOffRestart(const std::string& why) {
  if (!restart_pending_) return;
  restart_pending_ = false;
  outcome_.no_restart = why;
}

Status JobState::NodeIdle(int node) {
  if (node >= 0 && node < static_cast<int>(nodes_.size()) &&
      nodes_[node].authenticated && !nodes_[node].member) {
    nodes_[node].idle = true;  // stands by (it ended an empty generation)
    return Status::Ok();
  }
  if (node < 0 || node >= static_cast<int>(nodes_.size()) ||
      !nodes_[node].authenticated || phase_ != Phase::kStopping)
    return ProtocolError("generation end of node " + std::to_string(node) +
                         " while the job is " + PhaseName(phase_));
  // Ranks it never started (the stop came before its JobSpec) are not
  // waited for.
  for (const auto& [rank, r] : ranks_) {
    if (r.node_rank == node && r.started && !r.exited)
      return ProtocolError("generation end of node " + std::to_string(node) +
                           " before the exit of rank " + std::to_string(rank));
  }
  nodes_[node].idle = true;
  if (ReadyToRestart()) all_idle_at_ = Clock::now();
  return Status::Ok();
}

bool JobState::ReadyToRestart() const {
  return phase_ == Phase::kStopping && restart_pending_ && OthersIdle();
}

std::vector<int> JobState::ReadyAgents() const {
  const Clock::time_point now = Clock::now();
  std::vector<int> ready;
  for (size_t i = 0; i < nodes_.size(); ++i) {
    const NodeRecord& n = nodes_[i];
    if (n.idle && n.authenticated && !n.disconnected && n.lost_reason.empty() &&
        n.excluded_until <= now && !n.spent)
      ready.push_back(static_cast<int>(i));
  }
  return ready;
}

bool JobState::CanGrow(int max_nodes) const {
  if (phase_ != Phase::kRunning || members() >= max_nodes) return false;
  for (int agent : ReadyAgents()) {
    if (!nodes_[agent].member) return true;
  }
  return false;
}

bool JobState::Grow(const std::string& why) {
  if (phase_ != Phase::kRunning || interrupts_ > 0) return false;
  Outcome o;
  o.cause = Outcome::Cause::kGrow;
  o.reason = why;
  return Decide(o);
}

void JobState::NextGeneration(const Plan& plan) {
  DSL_CHECK(ReadyToRestart());
  history_.push_back(CurrentGeneration());
  ++restarts_;
  if (outcome_.cause != Outcome::Cause::kGrow) ++failure_restarts_;
  restart_pending_ = false;
  outcome_ = Outcome();
  for (const auto& node : plan.nodes)
    DSL_CHECK(node.agent >= 0 && node.agent < static_cast<int>(nodes_.size()) &&
              nodes_[node.agent].idle);
  SetRanks(plan);
  started_ = exited_ = 0;
  for (auto& n : nodes_) n.idle = !n.member && n.authenticated;
  stop_time_ = all_idle_at_ = {};
  generation_start_ = Clock::now();
  SetPhase(Phase::kStarting);
}

Status JobState::NodeAuthenticated(int node) {
  if (node < 0 || node >= static_cast<int>(nodes_.size()))
    return ProtocolError("unknown node " + std::to_string(node));
  NodeRecord& n = nodes_[node];
  if (!n.lost_reason.empty() && (restart_pending_ || !n.member)) {
    // A lost node's new agent: it waits for the next generation.
    n.lost_reason.clear();
    n.disconnected = n.process_exited = false;
    n.idle = true;
    if (ReadyToRestart()) all_idle_at_ = Clock::now();
  } else if (!n.member && !n.authenticated) {
    n.idle = true;  // a spare: it stands by
  }
  n.authenticated = true;
  return Status::Ok();
}

void JobState::NodeRestarting(int node) {
  NodeRecord& n = nodes_.at(node);
  n.authenticated = n.disconnected = n.process_exited = n.done = false;
  n.spent = false;  // a new agent
}

std::vector<std::string> JobState::MissingNodes() const {
  std::vector<std::string> missing;
  for (size_t i = 0; i < nodes_.size(); ++i) {
    const NodeRecord& n = nodes_[i];
    if (!n.lost_reason.empty())
      missing.push_back(hosts_[i] + " (" + n.lost_reason + ")");
  }
  return missing;
}

bool JobState::OthersIdle() const {
  for (const auto& n : nodes_) {
    if (n.lost_reason.empty() && !n.idle) return false;
  }
  return true;
}

void JobState::GiveUpRejoin(const std::string& why) {
  if (!restart_pending_) return;
  Outcome o;
  o.cause = Outcome::Cause::kNodeLost;
  o.reason = why;
  InterruptRestart(std::move(o));
}

StatusOr<JobState::Action> JobState::RankStarted(int node, int rank, int pid) {
  auto it = ranks_.find(rank);
  if (it == ranks_.end() || it->second.node_rank != node || it->second.started)
    return ProtocolError("start of unknown rank " + std::to_string(rank));
  it->second.pid = pid;
  it->second.started = true;
  ++started_;
  if (phase_ == Phase::kStarting && started_ == ranks_.size())
    SetPhase(Phase::kRunning);
  return Action::kNone;
}

StatusOr<JobState::Action> JobState::RankExited(int node, int rank,
                                                int exit_code, int signal,
                                                double exit_time,
                                                std::string error,
                                                bool stopped) {
  auto it = ranks_.find(rank);
  if (it == ranks_.end() || it->second.node_rank != node || it->second.exited)
    return ProtocolError("exit of unknown rank " + std::to_string(rank));
  RankRecord& r = it->second;
  r.exited = true;
  r.exit_code = exit_code;
  r.signal = signal;
  r.exit_time = exit_time;
  r.error = std::move(error);
  r.exited_at = Clock::now();
  r.stopped = stopped;
  ++exited_;
  if (r.failed()) {
    Outcome o;
    o.cause = Outcome::Cause::kRankFailed;
    o.rank = rank;
    o.node = node;
    o.exit_code = exit_code;
    o.signal = signal;
    o.exit_time = exit_time;
    o.reason = "rank " + std::to_string(rank) + " on " + hosts_[node] + " " +
               DescribeExit(exit_code, signal);
    if (Decide(o)) return Action::kAbortAll;
    // A rank our stop reached while it ran ends as a consequence, whatever
    // its (other node's) clock says; one that died first, even of a
    // SIGKILL from someone else, may be the cause.
    if (outcome_.cause == Outcome::Cause::kRankFailed && !stopped &&
        exit_time < outcome_.exit_time) {
      o.when = outcome_.when;
      outcome_ = std::move(o);  // the earlier failure is the cause
    }
    return Action::kNone;
  }
  if (exited_ == ranks_.size()) {
    Outcome o;
    o.cause = Outcome::Cause::kSucceeded;
    o.reason = "every rank finished";
    if (Decide(o)) return Action::kShutdownAll;
    // A grow's stop that found every rank finished on its own: the job is
    // done, not to be run again.
    bool all_done = outcome_.cause == Outcome::Cause::kGrow;
    for (const auto& [n, rec] : ranks_)
      all_done = all_done && !rec.stopped && !rec.failed();
    if (all_done) {
      restart_pending_ = false;
      o.when = outcome_.when;
      outcome_ = std::move(o);
      return Action::kShutdownAll;
    }
  }
  return Action::kNone;
}

bool JobState::NodeHasRunningRanks(int node) const {
  for (const auto& [rank, r] : ranks_) {
    if (r.node_rank == node && !r.exited) return true;
  }
  return false;
}

JobState::Action JobState::NodeDisconnected(int node, const std::string& why) {
  NodeRecord& n = nodes_.at(node);
  n.disconnected = true;
  // Between generations every node is needed: it is lost, and waited for;
  // so is one that stands by while the job runs.
  const bool standing_by =
      !n.member && (phase_ == Phase::kStarting || phase_ == Phase::kRunning);
  if (!NodeHasRunningRanks(node) && !restart_pending_ && !standing_by)
    return Action::kNone;
  return NodeLost(node, "its agent's connection ended (" + why + ")");
}

bool JobState::NodeLeftBeforeStart(int node) {
  if (phase_ != Phase::kStarting || started_ != 0 || node < 0 ||
      node >= static_cast<int>(nodes_.size()) ||
      !nodes_[node].lost_reason.empty())
    return false;
  const bool member = nodes_[node].member;
  nodes_[node] = NodeRecord();
  nodes_[node].member = member;
  return true;
}

JobState::Action JobState::AgentProcessExited(int node,
                                              const std::string& how) {
  NodeRecord& n = nodes_.at(node);
  n.process_exited = true;
  // A connected agent's end shows on its connection, which also carries its
  // last messages; one that never connected is lost here.
  if (n.authenticated) return Action::kNone;
  return NodeLost(node, "its agent " + how + " before connecting");
}

JobState::Action JobState::NodeLost(int node, const std::string& why) {
  NodeRecord& n = nodes_.at(node);
  if (!n.lost_reason.empty()) return Action::kNone;
  n.lost_reason = why;
  n.idle = false;
  const Clock::time_point now = Clock::now();
  if (!n.spent) {  // a spent agent's end is the start mode's way
    if (n.losses > 0 && now - n.lost_at < node_cooldown_)
      n.excluded_until = now + node_cooldown_;  // flapping
    ++n.losses;
    n.lost_at = now;
  }
  if (!n.member) {
    spdlog::warn("node {} ({}), standing by, was lost: {}", node, hosts_[node],
                 why);
    return Action::kNone;
  }
  Outcome o;
  o.cause = Outcome::Cause::kNodeLost;
  o.node = node;
  o.reason = "node " + std::to_string(node) + " (" + hosts_[node] +
             ") was lost: " + why;
  return Decide(o) ? Action::kAbortAll : Action::kNone;
}

JobState::Action JobState::Interrupted(int signal) {
  ++interrupts_;
  if (phase_ == Phase::kEnded) return Action::kNone;
  Outcome o;
  o.cause = Outcome::Cause::kInterrupted;
  o.signal = signal;
  o.reason = "interrupted by " + SignalName(signal);
  if (restart_pending_) {
    InterruptRestart(std::move(o));
    return Action::kAbortAll;  // the agents hear: no restart
  }
  if (Decide(o)) return Action::kAbortAll;
  return Action::kKillAll;  // already stopping: now at once
}

JobState::Action JobState::StoppedFromOutside(int signal,
                                              const std::string& why) {
  if (phase_ == Phase::kEnded) return Action::kNone;
  if (outcome_.cause == Outcome::Cause::kInterrupted) {
    outcome_.stopped_by = why;
    return Action::kNone;
  }
  Outcome o;
  o.cause = Outcome::Cause::kInterrupted;
  o.signal = signal;
  o.reason = why;
  o.stopped_by = why;
  if (restart_pending_) {
    InterruptRestart(std::move(o));
    return Action::kAbortAll;
  }
  return Decide(o) ? Action::kAbortAll : Action::kNone;
}

JobState::Action JobState::Hung(int rank, const std::string& why) {
  auto it = ranks_.find(rank);
  if (phase_ == Phase::kEnded || it == ranks_.end()) return Action::kNone;
  Outcome o;
  o.cause = Outcome::Cause::kHung;
  o.rank = rank;
  o.node = it->second.node_rank;
  o.reason = why;
  return Decide(o) ? Action::kAbortAll : Action::kNone;
}

void JobState::StartFailed(const Status& why) {
  if (phase_ != Phase::kStarting) return;
  outcome_.cause = Outcome::Cause::kStartFailed;
  outcome_.start_status = why;
  outcome_.reason = why.message();
  outcome_.when = Clock::now();
  stop_time_ = end_time_ = outcome_.when;
  SetPhase(Phase::kEnded);
}

bool JobState::AllNodesFinished() const {
  for (const auto& n : nodes_) {
    if (!n.finished()) return false;
  }
  return true;
}

void JobState::GiveUp() {
  if (phase_ != Phase::kStopping) return;
  end_time_ = Clock::now();
  gave_up_ = true;
  SetPhase(Phase::kEnded);
}

bool JobState::MaybeEnd() {
  // A restart that is due waits for its nodes (the Job gives up on them).
  if (phase_ != Phase::kStopping || restart_pending_ || !AllNodesFinished())
    return false;
  end_time_ = Clock::now();
  SetPhase(Phase::kEnded);
  return true;
}

}  // namespace dslaunch::launcher
