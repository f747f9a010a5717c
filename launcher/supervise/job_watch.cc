#include "launcher/supervise/job_watch.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <cstdio>

#include "base/unix_time.h"

namespace dslaunch::launcher {

namespace {

constexpr auto kTick = std::chrono::milliseconds(100);

std::string Brief(double s) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), s < 100 ? "%.3g" : "%.0f", s);
  return buf;
}

}  // namespace

JobWatch::JobWatch(boost::asio::io_context& io, const LaunchOptions& options,
                   Console& console, Hooks hooks)
    : timer_(io),
      options_(options),
      console_(console),
      hooks_(std::move(hooks)) {}

void JobWatch::Start() {
  running_ = true;
  Arm();
}

void JobWatch::Stop() {
  running_ = false;
  timer_.cancel();
}

void JobWatch::Arm() {
  timer_.expires_after(kTick);
  timer_.async_wait([this](const boost::system::error_code& ec) {
    if (ec || !running_) return;
    const double now = base::SteadySeconds();
    console_.Tick(now);
    if (now - last_check_ >= 1.0) Check(now);
    Arm();
  });
}

void JobWatch::Check(double now) {
  last_check_ = now;
  if (options_.hang_timeout_s > 0) CheckHangs(now);
  if (options_.straggler_k > 0) CheckStragglers();
}

std::string JobWatch::Who(int rank) const {
  const auto& ranks = console_.board().ranks();
  auto it = ranks.find(rank);
  return "rank " + std::to_string(rank) +
         (it == ranks.end() ? "" : " on " + it->second.host);
}

void JobWatch::CheckHangs(double now) {
  RankBoard& board = console_.board();
  // A rank named before that reported again is well.
  for (auto it = hung_now_.begin(); it != hung_now_.end();) {
    const RankView& r = board.ranks().at(*it);
    if (!r.hung && r.state == RankView::State::kRunning)
      console_.Note(Who(*it) + " reports progress again");
    it = r.hung ? std::next(it) : hung_now_.erase(it);
  }
  std::vector<int> fresh;
  for (int rank : board.Silent(now, options_.hang_timeout_s)) {
    if (hung_now_.count(rank)) continue;
    const RankView& r = board.ranks().at(rank);
    const bool reported = r.last_record_at > 0;
    const double since = reported ? r.last_record_at : r.started_at;
    const std::string what =
        Who(rank) + " (pid " + std::to_string(r.pid) + ") sent no progress " +
        "record for " + Brief(now - since) + " s while running" +
        (reported ? " (last at step " +
                        (r.step ? std::to_string(*r.step) : "?") + ")"
                  : " (none since it started)") +
        " (--hang_timeout " + Brief(options_.hang_timeout_s) + ")";
    board.MarkHung(rank, true);
    hung_now_.insert(rank);
    hangs_[rank] = what;
    fresh.push_back(rank);
    console_.Note("HANG: " + what + "; collecting its stacks");
  }
  if (fresh.empty()) return;
  hooks_.collect_stacks(fresh, "no progress for --hang_timeout");
  if (options_.on_hang == "abort")
    hooks_.abort(fresh.front(), hangs_[fresh.front()]);
}

void JobWatch::CheckStragglers() {
  RankBoard& board = console_.board();
  const std::vector<int> slow = board.Stragglers(options_.straggler_k);
  for (const auto& [rank, r] : board.ranks()) {
    const bool is_slow =
        std::find(slow.begin(), slow.end(), rank) != slow.end();
    if (r.straggler != is_slow) board.MarkStraggler(rank, is_slow);
  }
  const double median = board.MedianStepTime();
  for (int rank : slow) {
    if (!straggler_named_.insert(rank).second) continue;
    const RankView& r = board.ranks().at(rank);
    console_.Note("STRAGGLER: " + Who(rank) + " takes " + Brief(r.step_time_s) +
                  " s per step against the job's " + "median " + Brief(median) +
                  " s (--straggler_k " + Brief(options_.straggler_k) +
                  "); said once");
  }
}

}  // namespace dslaunch::launcher
