// The closing report of a job: what ended it first, where and how, its last
// words, and what was stopped in consequence.
#include "launcher/report/report.h"
#include "launcher/supervise/job.h"
#include "proto/exit_status.h"
#include "proto/progress.h"  // EscapeControlChars

namespace dslaunch::launcher {

static double Seconds(Clock::duration d) {
  return std::chrono::duration<double>(d).count();
}

static std::string Fixed(double v, int digits) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%.*f", digits, v);
  return buf;
}

void Job::PrintRankFailure(int rank) {
  const RankRecord& r = state_.ranks().at(rank);
  const NodePlan& node = plan_.nodes[r.node_rank];
  console_.Note("FAILED: rank " + std::to_string(rank) + " on " + node.host +
                " (node " + std::to_string(r.node_rank) + ", local rank " +
                std::to_string(rank - node.first_rank) + ", pid " +
                std::to_string(r.pid) + ") " +
                (oom_.count(rank) ? "was killed by the kernel's OOM killer (" +
                                        SignalName(r.signal) + ")"
                                  : DescribeExit(r.exit_code, r.signal)) +
                ", " + Fixed(Seconds(r.exited_at - start_time_), 2) +
                " s after launch");
  if (!r.error.empty()) console_.Note("  " + r.error);
  PrintForensics(rank);
  const auto& last = console_.LastLines(rank);
  if (last.empty()) {
    console_.Note("  it wrote no output");
  } else {
    console_.Note("  its last " + std::to_string(last.size()) + " lines:");
    // Escaped as every rank line is before the terminal: under --console
    // none or rank0 this is where these lines first reach it.
    for (const auto& line : last)
      console_.Note("  | " + proto::EscapeControlChars(line));
  }
}

void Job::PrintConsequences() {
  const Outcome& o = state_.outcome();
  std::vector<std::string> stopped, still;
  for (const auto& [rank, r] : state_.ranks()) {
    if (o.cause == Outcome::Cause::kRankFailed && rank == o.rank) continue;
    const std::string who = "rank " + std::to_string(rank) + " (" +
                            plan_.nodes[r.node_rank].host + ", pid " +
                            std::to_string(r.pid) + ")";
    if (!r.started) {
      still.push_back(who + " was never started");
    } else if (!r.exited) {
      still.push_back(who + " no exit reported");
    } else if (r.failed()) {  // only the first fails on its own
      stopped.push_back(who + " " +
                        (r.signal ? SignalName(r.signal)
                                  : "exit " + std::to_string(r.exit_code)));
    }
  }
  if (!stopped.empty()) {
    const std::string ms =
        Fixed(Seconds(state_.end_time() - state_.stop_time()) * 1000, 0);
    console_.Note("stopped in consequence: " + Plural(stopped.size(), "rank") +
                  (state_.gave_up()
                       ? ", not every agent confirmed its end " + ms +
                             " ms after the stop began (killed)"
                       : ", all gone " + ms + " ms after the stop began"));
    for (const auto& s : stopped) console_.Note("  " + s);
  }
  for (const auto& s : still) console_.Note("  " + s);
}

void Job::PrintOutcome() {
  const Outcome& o = state_.outcome();
  switch (o.cause) {
    case Outcome::Cause::kRankFailed:
      return PrintRankFailure(o.rank);
    case Outcome::Cause::kNodeLost:
      return console_.Note("FAILED: " + o.reason);
    case Outcome::Cause::kHung:
      return console_.Note("FAILED: HANG: " + o.reason +
                           "; stopped by --on_hang abort");
    case Outcome::Cause::kInterrupted:
      if (!o.stopped_by.empty())
        return console_.Note("stopped: " + o.stopped_by);
      return console_.Note("stopped: interrupted by the user (" +
                           SignalName(o.signal) + ")");
    default:
      return console_.Note(
          "FAILED: the job ended without an exit from every rank");
  }
}

int Job::Finish() {
  console_.StartCapture();
  PrintHangs();
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
  int code = state_.ExitStatus();
  const Outcome& o = state_.outcome();
  if (o.cause == Outcome::Cause::kStartFailed) {
    console_.Note("started nothing: the start failed (exit status " +
                  std::to_string(code) + ")");
    return code;
  }
  if (code == 0) {
    console_.Note("all " + Plural(state_.ranks().size(), "rank") + " on " +
                  Plural(plan_.nodes.size(), "node") + " exited 0 (" +
                  Fixed(Seconds(Clock::now() - start_time_), 2) + " s)");
    if (console_.sink_status().ok()) return code;
    // The job succeeded, its record did not: say so in the status.
    console_.Note(
        "FAILED: the job succeeded but its logs are incomplete (the first "
        "write error is above); exit status 74");
    return kExitIoError;
  }
  PrintOutcome();
  PrintConsequences();
  console_.Note("exit status " + std::to_string(code));
  WriteFailureBundle();
  return code;
}

}  // namespace dslaunch::launcher
