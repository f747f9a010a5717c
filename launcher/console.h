// Console: where rank output and progress go on the launcher's host. Every
// line is written whole with a "[host:rank]" prefix (stdout lines to stdout,
// stderr lines to stderr), copied to <log_dir>/rank-<r>.log, and the last few
// kept for the failure report. Progress records go to <log_dir>/metrics.jsonl
// with rank, node and time added; rank 0's are also shown on the console.
// Owned by the Launcher; main thread only.
#pragma once

#include <cstdio>
#include <deque>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "launcher/plan.h"
#include "launcher/terminal_writer.h"
#include "proto/status.h"

namespace dslaunch::launcher {

class Console {
 public:
  static constexpr size_t kKeptLines = 10;

  Console(FILE* out, FILE* err) : out_(out), err_(err) {}
  ~Console();

  // Creates log_dir (if non-empty) and one log file per rank of `plan`.
  Status Open(const Plan& plan, const std::string& log_dir);
  void Line(int rank, bool is_stderr, std::string_view line, bool partial);
  void Progress(int rank, std::string_view json, double time);
  // The launcher's own message, to stderr, prefixed "dslaunch: ".
  void Note(std::string_view message);
  // A line from outside the ranks (an agent's own log over ssh, pdsh's
  // messages), to stderr as it is.
  void Relay(std::string_view line);
  void Flush();
  // Returns once every console line so far has reached stdout/stderr.
  void DrainTerminal() { terminal_.Drain(); }
  const std::deque<std::string>& LastLines(int rank) { return last_[rank]; }
  int64_t progress_records() const { return progress_records_; }

 private:
  FILE* out_;
  FILE* err_;
  TerminalWriter terminal_;
  std::map<int, std::string> prefix_;  // rank -> "[host:rank] "
  std::map<int, std::string> host_;
  std::map<int, FILE*> logs_;
  std::map<int, std::deque<std::string>> last_;
  FILE* metrics_ = nullptr;
  int64_t progress_records_ = 0;
};

}  // namespace dslaunch::launcher
