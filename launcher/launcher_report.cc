// The closing report of a job: what failed first, where and how, its last
// words, and what was stopped in consequence.
#include <sstream>

#include "launcher/launcher.h"
#include "launcher/report.h"

namespace dslaunch::launcher {

static double Seconds(std::chrono::steady_clock::duration d) {
  return std::chrono::duration<double>(d).count();
}

static std::string Fixed(double v, int digits) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%.*f", digits, v);
  return buf;
}

void Launcher::PrintFailure(int rank) {
  const RankState& r = ranks_.at(rank);
  const NodePlan& node = Node(r.node_rank);
  console_.Note(
      "FAILED: rank " + std::to_string(rank) + " on " + node.host + " (node " +
      std::to_string(r.node_rank) + ", local rank " +
      std::to_string(rank - node.first_rank) + ", pid " +
      std::to_string(r.pid) + ") " + DescribeExit(r.exit_code, r.signal) +
      ", " + Fixed(Seconds(r.exited_at - start_time_), 2) + " s after launch");
  if (!r.error.empty()) console_.Note("  " + r.error);
  const auto& last = console_.LastLines(rank);
  if (last.empty()) {
    console_.Note("  it wrote no output");
  } else {
    console_.Note("  its last " + std::to_string(last.size()) + " lines:");
    for (const auto& line : last) console_.Note("  | " + line);
  }
}

void Launcher::PrintConsequences() {
  std::vector<std::string> stopped, still;
  for (const auto& [rank, r] : ranks_) {
    if (first_failed_rank_ && rank == *first_failed_rank_) continue;
    const std::string who = "rank " + std::to_string(rank) + " (" +
                            Node(r.node_rank).host + ", pid " +
                            std::to_string(r.pid) + ")";
    if (!r.started) {
      still.push_back(who + " was never started");
    } else if (!r.exited) {
      still.push_back(who + " no exit reported");
    } else if (r.signal || r.exit_code) {  // only the first fails on its own
      stopped.push_back(who + " " +
                        (r.signal ? SignalName(r.signal)
                                  : "exit " + std::to_string(r.exit_code)));
    }
  }
  if (!stopped.empty()) {
    console_.Note("stopped in consequence: " + std::to_string(stopped.size()) +
                  " rank(s), all gone " +
                  Fixed(Seconds(done_time_ - stop_time_) * 1000, 0) +
                  " ms after the stop began");
    for (const auto& s : stopped) console_.Note("  " + s);
  }
  for (const auto& s : still) console_.Note("  " + s);
}

void Launcher::PrintReport() {
  for (const auto& [rank, count] : malformed_progress_) {
    console_.Note("rank " + std::to_string(rank) + ": " +
                  std::to_string(count) +
                  " malformed progress record(s) dropped");
  }
  for (const auto& [rank, count] : dropped_progress_) {
    console_.Note("rank " + std::to_string(rank) + ": " +
                  std::to_string(count) +
                  " progress record(s) dropped (written faster than sent)");
  }
  const int code = ExitCode();
  if (preflight_failed_) {
    console_.Note("started nothing: the preflight failed (exit status 69)");
    return;
  }
  const double elapsed =
      Seconds(std::chrono::steady_clock::now() - start_time_);
  if (code == 0) {
    console_.Note("all " + std::to_string(ranks_.size()) + " ranks on " +
                  std::to_string(plan_.nodes.size()) + " nodes exited 0 (" +
                  Fixed(elapsed, 2) + " s)");
    return;
  }
  if (first_failed_rank_) {
    PrintFailure(*first_failed_rank_);
  } else if (lost_node_) {
    console_.Note("FAILED: node " + std::to_string(*lost_node_) + " (" +
                  Node(*lost_node_).host +
                  ") was lost: " + nodes_[*lost_node_].lost_reason);
  } else if (interrupted_) {
    console_.Note("stopped: interrupted by the user (" +
                  SignalName(interrupt_signal_) + ")");
  } else {
    console_.Note("FAILED: the job ended without an exit from every rank");
  }
  PrintConsequences();
  console_.Note("exit status " + std::to_string(code));
}

}  // namespace dslaunch::launcher
