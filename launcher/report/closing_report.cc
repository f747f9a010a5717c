// The closing report (closing_report.h).
#include "launcher/report/closing_report.h"

#include <signal.h>

#include <cstdio>

#include "base/exit_status.h"
#include "launcher/report/forensics.h"
#include "proto/progress.h"  // EscapeControlChars

extern char** environ;

namespace dslaunch::launcher {

namespace {

class Report {
 public:
  Report(const JobRecord& job, Console& console)
      : job_(job), console_(console) {}
  int Print();

 private:
  void PrintOutcome();
  const NodePlan& NodeOf(const RankRecord& r) const;
  void PrintRankFailure(int rank);
  void PrintConsequences();
  // Under a rank's FAILED line: how the kernel or Python ended it.
  void PrintForensics(int rank);
  void PrintHangs();
  // --max_restarts: one line per generation that ended before the last.
  void PrintGenerations();
  void WriteFailureBundle();

  const JobRecord& job_;
  Console& console_;
};

double Seconds(Clock::duration d) {
  return std::chrono::duration<double>(d).count();
}

std::string Fixed(double v, int digits) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%.*f", digits, v);
  return buf;
}

// The node of the current generation that runs `r` (its record names the
// agent; node ranks may differ from agents after a restart).
const NodePlan& Report::NodeOf(const RankRecord& r) const {
  for (const NodePlan& node : job_.plan.nodes) {
    if (node.agent == r.node_rank) return node;
  }
  static const NodePlan kUnknown{-1, "?", {}, 0, {}, {}, -1};
  return kUnknown;
}

void Report::PrintRankFailure(int rank) {
  const RankRecord& r = job_.state.ranks().at(rank);
  const NodePlan& node = NodeOf(r);
  console_.Note("FAILED: rank " + std::to_string(rank) + " on " + node.host +
                " (node " + std::to_string(node.node_rank) + ", local rank " +
                std::to_string(rank - node.first_rank) + ", pid " +
                std::to_string(r.pid) + ") " +
                (job_.oom.count(rank)
                     ? "was killed by the kernel's OOM killer (" +
                           SignalName(r.signal) + ")"
                     : DescribeExit(r.exit_code, r.signal)) +
                ", " + Fixed(Seconds(r.exited_at - job_.start_time), 2) +
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

void Report::PrintConsequences() {
  const Outcome& o = job_.state.outcome();
  std::vector<std::string> stopped, still;
  for (const auto& [rank, r] : job_.state.ranks()) {
    if (o.cause == Outcome::Cause::kRankFailed && rank == o.rank) continue;
    const std::string who = "rank " + std::to_string(rank) + " (" +
                            NodeOf(r).host + ", pid " + std::to_string(r.pid) +
                            ")";
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
    const std::string ms = Fixed(
        Seconds(job_.state.end_time() - job_.state.stop_time()) * 1000, 0);
    console_.Note("stopped in consequence: " + Plural(stopped.size(), "rank") +
                  (job_.state.gave_up()
                       ? ", not every agent confirmed its end " + ms +
                             " ms after the stop began (killed)"
                       : ", all gone " + ms + " ms after the stop began"));
    for (const auto& s : stopped) console_.Note("  " + s);
  }
  for (const auto& s : still) console_.Note("  " + s);
}

void Report::PrintOutcome() {
  const Outcome& o = job_.state.outcome();
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
      if (o.signal == SIGINT || o.signal == 0)
        return console_.Note("stopped: interrupted by the user (SIGINT)");
      // SIGTERM: a preemption (SLURM's --signal, a pod's deletion) or kill.
      return console_.Note("stopped: dslaunch received " +
                           SignalName(o.signal) +
                           " and passed it on to every rank");
    default:
      return console_.Note(
          "FAILED: the job ended without an exit from every rank");
  }
}

void Report::PrintGenerations() {
  constexpr size_t kHostsShown = 8;
  for (const Generation& g : job_.state.history()) {
    std::string hosts;
    for (size_t i = 0; i < g.hosts.size() && i < kHostsShown; ++i)
      hosts += (i ? ", " : "") + g.hosts[i];
    if (g.hosts.size() > kHostsShown)
      hosts += " and " + std::to_string(g.hosts.size() - kHostsShown) + " more";
    console_.Note("generation " + std::to_string(g.restart_count) + " on " +
                  Plural(g.hosts.size(), "node") + " (" + hosts +
                  "): " + g.outcome.reason + ", " +
                  Fixed(Seconds(g.stopped - job_.start_time), 2) +
                  " s after launch; every rank of it was gone " +
                  Fixed(Seconds(g.ended - g.stopped) * 1000, 0) + " ms later");
  }
}

int Report::Print() {
  console_.StartCapture();
  PrintHangs();
  PrintGenerations();
  for (const auto& [rank, count] : job_.malformed_progress) {
    console_.Note("rank " + std::to_string(rank) + ": " +
                  std::to_string(count) +
                  " malformed progress record(s) dropped");
  }
  for (const auto& [rank, count] : job_.dropped_progress) {
    console_.Note("rank " + std::to_string(rank) + ": " +
                  std::to_string(count) +
                  " progress record(s) dropped (written faster than sent)");
  }
  int code = job_.state.ExitStatus();
  const Outcome& o = job_.state.outcome();
  if (o.cause == Outcome::Cause::kStartFailed) {
    console_.Note("started nothing: the start failed (exit status " +
                  std::to_string(code) + ")");
    return code;
  }
  if (code == 0) {
    const int restarts = job_.state.restarts();
    console_.Note(
        "all " + Plural(job_.state.ranks().size(), "rank") + " on " +
        Plural(job_.plan.nodes.size(), "node") + " exited 0 (" +
        Fixed(Seconds(Clock::now() - job_.start_time), 2) + " s" +
        (restarts > 0
             ? ", after " + Plural(static_cast<size_t>(restarts), "restart")
             : "") +
        ")");
    if (console_.sink_status().ok()) return code;
    // The job succeeded, its record did not: say so in the status.
    console_.Note(
        "FAILED: the job succeeded but its logs are incomplete (the first "
        "write error is above); exit status 74");
    return kExitIoError;
  }
  PrintOutcome();
  if (!o.no_restart.empty())
    console_.Note("no restart (--max_restarts " +
                  std::to_string(job_.state.max_restarts()) +
                  "): " + o.no_restart);
  // An interrupt that called a restart off: the ranks are those of the
  // generation its line above told of.
  const auto& history = job_.state.history();
  if (history.empty() || history.back().restart_count != job_.state.restarts())
    PrintConsequences();
  console_.Note("exit status " + std::to_string(code));
  WriteFailureBundle();
  return code;
}

// Under a rank's FAILED line: how the kernel or Python ended it.
void Report::PrintForensics(int rank) {
  if (auto it = job_.oom.find(rank); it != job_.oom.end()) {
    console_.Note("  killed by the kernel's OOM killer (out of memory)" +
                  (it->second.empty()
                       ? std::string()
                       : ": " + proto::EscapeControlChars(it->second)));
  }
  if (auto it = job_.error_files.find(rank); it != job_.error_files.end()) {
    const auto lines = DescribeErrorFile(it->second);
    if (!lines.empty())
      console_.Note("  its error file (TORCHELASTIC_ERROR_FILE) says:");
    for (const auto& line : lines) console_.Note("  " + line);
  }
}

void Report::PrintHangs() {
  for (const auto& [rank, what] : job_.hangs) {
    console_.Note(
        "hang seen: " + what +
        (job_.stacks.count(rank) ? "; its stacks were collected" : ""));
  }
}

void Report::WriteFailureBundle() {
  if (job_.log_dir.empty()) return;
  FailureRecord record;
  record.report = console_.TakeCaptured();
  record.plan = FormatPlanTable(job_.plan);
  record.rank_env = job_.rank_env;
  for (char** e = environ; e != nullptr && *e != nullptr; ++e) {
    const std::string kv = *e;
    const size_t eq = kv.find('=');
    if (eq != std::string::npos)
      record.launcher_env.emplace_back(kv.substr(0, eq), kv.substr(eq + 1));
  }
  record.job_secret = job_.secret;
  for (const auto& [rank, r] : job_.state.ranks())
    record.last_lines[rank] = &console_.LastLines(rank);
  record.stacks = job_.stacks;
  record.error_files = job_.error_files;
  auto dir = launcher::WriteFailureBundle(job_.log_dir, record);
  console_.Note(dir.ok() ? "for a bug report: " + *dir +
                               " (report, last lines, stacks, plan, "
                               "environment with secrets redacted)"
                         : dir.status().message());
}

}  // namespace

int PrintClosingReport(const JobRecord& job, Console& console) {
  return Report(job, console).Print();
}

}  // namespace dslaunch::launcher
