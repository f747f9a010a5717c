#include "launcher/report/rank_board.h"

#include <algorithm>
#include <cmath>
#include <nlohmann/json.hpp>

#include "proto/progress.h"  // NonFiniteValue

namespace dslaunch::launcher {

namespace {

double Median(std::vector<double> v) {
  if (v.empty()) return 0;
  const size_t mid = v.size() / 2;
  std::nth_element(v.begin(), v.begin() + mid, v.end());
  if (v.size() % 2 == 1) return v[mid];
  const double upper = v[mid];
  return (*std::max_element(v.begin(), v.begin() + mid) + upper) / 2;
}

// A number, or the string a non-finite one was written as (the agent turns
// a bare NaN or inf into "NaN", "Infinity"): a diverged loss is shown.
std::optional<double> Number(const nlohmann::ordered_json& v) {
  if (v.is_number()) return v.get<double>();
  if (v.is_string())
    return proto::NonFiniteValue(v.get_ref<const std::string&>());
  return std::nullopt;
}

// A step count: an integer (or integral number) in a sane range.
std::optional<int64_t> Count(const nlohmann::ordered_json& v) {
  const auto d = Number(v);
  if (!d || *d < 0 || *d > 9e15 || std::floor(*d) != *d) return std::nullopt;
  return static_cast<int64_t>(*d);
}

void UpdateStepTime(RankView& r, double time) {
  if (!r.step) return;
  if (!r.recent.empty() && r.recent.back().second == *r.step) return;
  r.recent.emplace_back(time, *r.step);
  if (r.recent.size() > RankBoard::kStepTimes + 1) r.recent.pop_front();
  std::vector<double> per_step;
  for (size_t i = 1; i < r.recent.size(); ++i) {
    const auto [t0, s0] = r.recent[i - 1];
    const auto [t1, s1] = r.recent[i];
    if (s1 > s0 && t1 >= t0) per_step.push_back((t1 - t0) / double(s1 - s0));
  }
  if (!per_step.empty()) r.step_time_s = Median(std::move(per_step));
}

}  // namespace

void RankBoard::Reset(const Plan& plan) {
  ranks_.clear();
  num_nodes_ = static_cast<int>(plan.nodes.size());
  for (const auto& node : plan.nodes) {
    for (size_t i = 0; i < node.slots.size(); ++i) {
      RankView view;
      view.rank = node.first_rank + static_cast<int>(i);
      view.node_rank = node.node_rank;
      view.host = node.host;
      ranks_[view.rank] = std::move(view);
    }
  }
}

RankView* RankBoard::Find(int rank) {
  auto it = ranks_.find(rank);
  return it == ranks_.end() ? nullptr : &it->second;
}

void RankBoard::Record(int rank, const nlohmann::ordered_json& record,
                       double time) {
  RankView* r = Find(rank);
  if (r == nullptr || !record.is_object()) return;
  ++r->records;
  r->last_record_at = time;
  r->hung = false;
  r->scalars.clear();
  for (const auto& [key, value] : record.items()) {
    const auto number = Number(value);
    if (!number) continue;
    if (key == "step") {
      if (auto step = Count(value)) r->step = step;
    } else if (key == "total_steps") {
      if (auto total = Count(value)) r->total_steps = total;
    } else if (key == "loss") {
      r->loss = *number;
      if (std::isfinite(*number)) {  // the sparkline scales finite values
        r->loss_history.push_back(*number);
        if (r->loss_history.size() > kHistory) r->loss_history.pop_front();
      }
    } else if (key == "tokens_per_s") {
      r->tokens_per_s = *number;
    } else if (key == "gpu_mem_bytes") {
      if (auto bytes = Count(value)) r->gpu_mem_bytes = *bytes;
    }
    if (r->scalars.size() < kMaxScalars && !key.empty() &&
        key.size() <= kMaxScalarName && key != "step" && key != "total_steps")
      r->scalars.emplace_back(key, *number);
  }
  UpdateStepTime(*r, time);
}

void RankBoard::Started(int rank, int pid, double time) {
  if (RankView* r = Find(rank)) {
    r->state = RankView::State::kRunning;
    r->pid = pid;
    r->started_at = time;
  }
}

void RankBoard::Exited(int rank, int exit_code, int signal, bool oom_killed) {
  if (RankView* r = Find(rank)) {
    r->state = RankView::State::kExited;
    r->exit_code = exit_code;
    r->signal = signal;
    r->oom_killed = oom_killed;
    r->hung = false;
  }
}

void RankBoard::Stats(int rank, int64_t rss_bytes) {
  if (RankView* r = Find(rank)) r->rss_bytes = rss_bytes;
}

std::vector<int> RankBoard::Silent(double now, double timeout_s) const {
  std::vector<int> out;
  for (const auto& [rank, r] : ranks_) {
    if (r.state != RankView::State::kRunning) continue;
    const double since = r.last_record_at > 0 ? r.last_record_at : r.started_at;
    if (since > 0 && now - since > timeout_s) out.push_back(rank);
  }
  return out;
}

double RankBoard::MedianStepTime() const {
  std::vector<double> times;
  for (const auto& [rank, r] : ranks_)
    if (r.step_time_s > 0) times.push_back(r.step_time_s);
  return Median(std::move(times));
}

std::vector<int> RankBoard::Stragglers(double k) const {
  std::vector<double> times;
  for (const auto& [rank, r] : ranks_)
    if (r.step_time_s > 0) times.push_back(r.step_time_s);
  if (times.size() < 3) return {};
  const double median = Median(times);
  std::vector<double> deviations;
  for (double t : times) deviations.push_back(std::fabs(t - median));
  const double mad = Median(std::move(deviations));
  const double bound = std::max(median + k * mad, median * 1.1);
  std::vector<int> out;
  for (const auto& [rank, r] : ranks_) {
    if (r.state == RankView::State::kRunning && r.step_time_s > bound)
      out.push_back(rank);
  }
  return out;
}

void RankBoard::MarkHung(int rank, bool hung) {
  if (RankView* r = Find(rank)) r->hung = hung;
}

void RankBoard::MarkStraggler(int rank, bool straggler) {
  if (RankView* r = Find(rank)) r->straggler = straggler;
}

}  // namespace dslaunch::launcher
