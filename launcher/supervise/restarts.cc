#include "launcher/supervise/restarts.h"

#include <spdlog/spdlog.h>

#include <algorithm>  // min

#include "base/unix_time.h"
#include "launcher/start/start_mode.h"

namespace dslaunch::launcher {

namespace {

std::string Join(const std::vector<std::string>& parts) {
  std::string out;
  for (const auto& p : parts) out += (out.empty() ? "" : ", ") + p;
  return out;
}

std::string WholeSeconds(double s) {
  return std::to_string(static_cast<int64_t>(s)) + " s";
}

}  // namespace

std::string RestartName(const JobState& state, bool grow, int ahead) {
  const int generation = state.restarts() + ahead;
  if (grow) {
    return "restart " + std::to_string(generation) +
           ", which grows the job (no restart of --max_restarts spent)";
  }
  const int spent = state.failure_restarts() + ahead;
  return "restart " + std::to_string(spent) + " of " +
         std::to_string(state.max_restarts()) +
         (spent == generation
              ? std::string()
              : " (generation " + std::to_string(generation) + ")");
}

Restarts::Restarts(boost::asio::io_context& io, const LaunchOptions& options,
                   Console& console, JobState& state, const Plan& pool,
                   int min_nodes, int max_nodes, Hooks hooks)
    : io_(io),
      options_(options),
      console_(console),
      state_(state),
      pool_(pool),
      min_nodes_(static_cast<size_t>(min_nodes)),
      max_nodes_(static_cast<size_t>(max_nodes)),
      hooks_(std::move(hooks)),
      tick_(io),
      backoff_(io) {}

std::string Restarts::Who(int agent) const {
  return "node " + std::to_string(agent) + " (" +
         pool_.nodes.at(static_cast<size_t>(agent)).host + ")";
}

void Restarts::NoteFreePort(int agent, int port) {
  if (port > 0 && port <= 65535) free_ports_[agent] = port;
}

int Restarts::FreePort(int agent) const {
  auto it = free_ports_.find(agent);
  return it == free_ports_.end() ? 0 : it->second;
}

void Restarts::Stop() {
  stopped_ = true;
  tick_.cancel();
  backoff_.cancel();
}

void Restarts::TickIn(Clock::duration d) {
  tick_.expires_after(d);
  tick_.async_wait([this](const boost::system::error_code& ec) {
    if (!ec) Tend();
  });
}

bool Restarts::RetireSpent() {
  bool any = false;
  for (size_t i = 0; i < state_.nodes().size(); ++i) {
    const int n = static_cast<int>(i);
    const NodeRecord& node = state_.node(n);
    if (!node.spent || !node.lost_reason.empty()) continue;
    any = true;
    if (!node.authenticated || node.disconnected || retired_.count(n)) continue;
    retired_[n] = Clock::now();
    if (hooks_.retire) hooks_.retire(n);
  }
  return any;
}

void Restarts::ReviveLost(bool* may_return, bool* excluded) {
  const Clock::time_point now = Clock::now();
  const char* starts = StartModeNamed(options_.launcher).each_generation_starts;
  std::vector<std::string> revived;  // said once, where one run starts all
  bool retry = false;
  for (size_t i = 0; i < state_.nodes().size(); ++i) {
    const int n = static_cast<int>(i);
    const NodeRecord& node = state_.node(n);
    if (node.lost_reason.empty()) continue;
    if (!starter_->CanStartAgain()) continue;
    if (node.excluded_until > now + base::Millis(options_.rejoin_timeout_s)) {
      *excluded = true;
      continue;
    }
    *may_return = true;
    if (!node.process_exited) {
      // Its link was cut but the agent may still run: it must end before
      // another takes the node. A spent one is ending on its own (it was
      // told to, or its tool ends it): killed only if it has not in 10 s.
      if (node.disconnected && !started_again_.count(n)) {
        auto since = ending_since_.emplace(n, now).first->second;
        if (!node.spent || now - since > std::chrono::seconds(10)) {
          ending_since_.erase(n);
          starter_->Kill(n);
        }
      }
      continue;
    }
    ending_since_.erase(n);
    retired_.erase(n);
    auto last = started_again_.find(n);
    if (node.excluded_until > now ||
        (last != started_again_.end() &&
         now - last->second < std::chrono::seconds(5)))
      continue;
    if (starter_->AgentsMakeSecrets() && !SecretMayGoOut()) continue;
    started_again_[n] = now;
    const std::string what = StartModeNamed(options_.launcher).agents_join
                                 ? "waiting for " + Who(n) + " to join again"
                                 : "starting the agent of " + Who(n) + " again";
    // Said once per loss; the retries every 5 s go to the log.
    if (starts != nullptr) {
      revived.push_back(Who(n));
      retry = retry || last != started_again_.end();
    } else if (last == started_again_.end()) {
      console_.Note(what);
    } else {
      spdlog::info("{} (its host did not answer)", what);
    }
    state_.NodeRestarting(n);
    if (hooks_.starting_again) hooks_.starting_again(n);
    starter_->StartAgain(n);
  }
  if (revived.empty()) return;
  const std::string what = std::string("starting ") + starts +
                           " for the next generation, on " + Join(revived);
  if (retry) {
    spdlog::info("{} (the last one did not start)", what);
  } else {
    console_.Note(what);
  }
}

// A secret an agent makes passes through the start tool's pipes, where a
// rank of the same user can read it (/proc): such an agent starts only while
// no rank runs, while the next generation can still use it (not once it is
// due to start without it), and that generation waits until its secret is
// spent or its agent has ended (SecretsOut).
bool Restarts::SecretMayGoOut() const {
  return state_.ReadyToRestart() && !going_ &&
         state_.ReadyAgents().size() < max_nodes_;
}

bool Restarts::SecretsOut() const {
  if (!starter_->AgentsMakeSecrets()) return false;
  for (const auto& [agent, since] : started_again_) {
    const NodeRecord& node = state_.node(agent);
    if (!node.authenticated && !node.process_exited) return true;
  }
  return false;
}

void Restarts::Tend() {
  if (stopped_ || !starter_) return;
  const Phase phase = state_.phase();
  if (!state_.restart_pending() && phase != Phase::kStarting &&
      phase != Phase::kRunning)
    return;  // the job ends
  // Spent agents on their way out come back as new ones.
  bool may_return = state_.ReadyToRestart() && RetireSpent();
  bool excluded = false;
  ReviveLost(&may_return, &excluded);
  if (!state_.restart_pending()) {
    if (state_.CanGrow(static_cast<int>(max_nodes_))) {
      std::vector<std::string> back;
      for (int a : state_.ReadyAgents()) {
        if (!state_.node(a).member) back.push_back(Who(a));
      }
      const size_t grown = std::min(
          max_nodes_, static_cast<size_t>(state_.members()) + back.size());
      return hooks_.grow(
          Join(back) + (back.size() == 1 ? " stands" : " stand") +
          " by: the job grows from " + std::to_string(state_.members()) +
          " to " + std::to_string(grown) + " nodes");
    }
    // Again while lost nodes may come back (or their cooldown ends).
    if (may_return || excluded) TickIn(std::chrono::seconds(1));
    return;
  }
  Decide(may_return, excluded);
}

void Restarts::Decide(bool may_return, bool excluded) {
  // Ranks still running somewhere: the stop's timer bounds that wait.
  if (!state_.ReadyToRestart()) return;
  const Clock::time_point now = Clock::now();
  if (wait_since_ == Clock::time_point{}) {
    wait_since_ = settle_since_ = now;
    ready_seen_ = 0;
  }
  std::vector<int> ready = state_.ReadyAgents();
  if (ready.size() > ready_seen_) settle_since_ = now;
  ready_seen_ = ready.size();
  const bool enough = ready.size() >= min_nodes_;
  const Clock::time_point settled =
      settle_since_ + base::Millis(options_.join_settle_s);
  const Clock::time_point deadline =
      wait_since_ + base::Millis(options_.rejoin_timeout_s);
  const bool go = ready.size() >= max_nodes_ || (enough && !may_return) ||
                  (enough && now >= std::min(settled, deadline));
  if (!go) going_ = false;
  if (go && SecretsOut()) {
    // Agents started again have their secrets on the way: none of them may
    // be left unspent while ranks run. Each connects or ends soon (its
    // tool's own timeout); one that has done neither within --start_timeout
    // (a step SLURM keeps pending) is killed. No further one is started
    // meanwhile.
    going_ = true;
    for (auto& [agent, since] : started_again_) {
      const NodeRecord& node = state_.node(agent);
      if (node.authenticated || node.process_exited ||
          now - since < base::Millis(options_.start_timeout_s))
        continue;
      console_.Note(Who(agent) +
                    ": its agent neither connected nor ended "
                    "within --start_timeout; killing it");
      since = now;
      starter_->Kill(agent);
    }
    return TickIn(std::chrono::seconds(1));
  }
  if (go) {
    if (ready.size() > max_nodes_) ready.resize(max_nodes_);
    if (backoff_armed_) return;
    backoff_armed_ = true;
    tick_.cancel();
    backoff_.expires_after(base::Millis(options_.restart_backoff_s));
    backoff_.async_wait([this, ready](const boost::system::error_code& ec) {
      backoff_armed_ = false;
      if (ec || stopped_) return;
      // Still every one of them ready (none lost meanwhile)?
      const std::vector<int> now_ready = state_.ReadyAgents();
      bool all = state_.ReadyToRestart();
      for (int a : ready) {
        all = all && std::find(now_ready.begin(), now_ready.end(), a) !=
                         now_ready.end();
      }
      if (!all || SecretsOut()) return Tend();
      wait_since_ = {};
      going_ = false;
      hooks_.start_generation(ready);
    });
    return;
  }
  const std::string short_of =
      "not enough nodes" +
      (min_nodes_ < state_.nodes().size()
           ? " (at least " + std::to_string(min_nodes_) + " needed, " +
                 std::to_string(ready.size()) + " ready)"
           : std::string());
  if (!may_return) {
    if (excluded) {
      return hooks_.give_up(
          short_of + ": excluded for --node_cooldown " +
          WholeSeconds(options_.node_cooldown_s) +
          " (lost twice within it): " + Join(state_.MissingNodes()));
    }
    for (size_t i = 0; i < state_.nodes().size(); ++i) {
      const NodeRecord& node = state_.node(static_cast<int>(i));
      if (node.lost_reason.empty()) continue;
      return hooks_.give_up(
          (min_nodes_ < state_.nodes().size() ? short_of + ": " : "") +
          Who(static_cast<int>(i)) + " was lost (" + node.lost_reason +
          "), and this start mode cannot start its agent again");
    }
    return hooks_.give_up(short_of);
  }
  if (now >= deadline) {
    return hooks_.give_up(short_of + " within --rejoin_timeout " +
                          WholeSeconds(options_.rejoin_timeout_s) +
                          "; missing: " + Join(state_.MissingNodes()));
  }
  Clock::time_point next = std::min(now + std::chrono::seconds(1), deadline);
  if (enough) next = std::min(next, settled);
  TickIn(std::max<Clock::duration>(next - now, std::chrono::milliseconds(1)));
}

}  // namespace dslaunch::launcher
