// RankBoard: what the launcher knows of each rank while the job runs, fed
// from progress records, the agents' RankStats and the start and exit
// messages; read by the console's live table, the Prometheus endpoint, the
// TensorBoard sink and the hang and straggler checks. Owned by the Console;
// main thread only. Times are base::SteadySeconds() of the launcher's host:
// records are stamped when they arrive, so ages never depend on the agents'
// clocks or on the wall clock jumping.
#pragma once

#include <cstdint>
#include <deque>
#include <map>
#include <nlohmann/json_fwd.hpp>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "launcher/plan/plan.h"

namespace dslaunch::launcher {

struct RankView {
  enum class State { kPending, kRunning, kExited };

  int rank = 0;
  int node_rank = 0;
  std::string host;
  State state = State::kPending;
  int pid = 0;
  double started_at = 0;      // 0: not started
  double last_record_at = 0;  // 0: no record yet
  int64_t records = 0;
  std::optional<int64_t> step;
  std::optional<int64_t> total_steps;
  std::optional<double> loss;
  std::optional<double> tokens_per_s;
  // The last record's numeric top-level fields (at most kMaxScalars, in the
  // record's order), e.g. {"loss", 2.3}, {"lr", 3e-4}.
  std::vector<std::pair<std::string, double>> scalars;
  std::deque<double> loss_history;  // the last kHistory losses
  // Seconds per step: the median of the last kStepTimes intervals between
  // records whose step advanced; 0 until two such records came.
  double step_time_s = 0;
  int64_t rss_bytes = -1;  // -1: not known
  // A GPU rank's allocator peak, from its records' "gpu_mem_bytes" (-1: none).
  int64_t gpu_mem_bytes = -1;
  int exit_code = 0;
  int signal = 0;
  bool oom_killed = false;
  bool hung = false;       // named by the hang check (cleared by a record)
  bool straggler = false;  // named by the straggler check

  std::deque<std::pair<double, int64_t>> recent;  // (time, step) of records
};

class RankBoard {
 public:
  static constexpr size_t kHistory = 24;
  static constexpr size_t kStepTimes = 8;
  static constexpr size_t kMaxScalars = 32;
  static constexpr size_t kMaxScalarName = 64;

  RankBoard() = default;
  // Every rank of the plan, pending. Called again with the final plan
  // (--launcher join) before any rank started.
  void Reset(const Plan& plan);

  // A validated progress record (a JSON object). Known fields: "step",
  // "total_steps", "loss", "tokens_per_s", "gpu_mem_bytes"; every number at the
  // top level (and NaN, Infinity as the agent writes them) becomes a scalar.
  // Records of unknown ranks are ignored.
  void Record(int rank, const nlohmann::ordered_json& record, double time);
  void Started(int rank, int pid, double time);
  void Exited(int rank, int exit_code, int signal, bool oom_killed);
  void Stats(int rank, int64_t rss_bytes);

  // Ranks still running whose last record (or start, with none) is more
  // than `timeout_s` before `now`.
  std::vector<int> Silent(double now, double timeout_s) const;
  // Running ranks whose step time is above median + k * MAD of the ranks
  // that have one, and at least 10% above the median (a MAD of 0 must not
  // name a rank 1% slower). Needs at least 3 ranks with a step time.
  std::vector<int> Stragglers(double k) const;
  void MarkHung(int rank, bool hung);
  void MarkStraggler(int rank, bool straggler);

  const std::map<int, RankView>& ranks() const { return ranks_; }
  int num_nodes() const { return num_nodes_; }
  // Restarts of the job so far (--max_restarts); Reset keeps it.
  int restarts() const { return restarts_; }
  void set_restarts(int n) { restarts_ = n; }
  // The median step time over ranks that have one; 0 if none.
  double MedianStepTime() const;

 private:
  RankView* Find(int rank);

  std::map<int, RankView> ranks_;
  int num_nodes_ = 0;
  int restarts_ = 0;
};

}  // namespace dslaunch::launcher
