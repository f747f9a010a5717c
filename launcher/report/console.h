// Console: where rank output and progress go on the launcher's host. Lines
// go to the terminal with a "[host:rank] " prefix (stdout lines to stdout,
// stderr lines to stderr; identical lines of several ranks folded into
// "[host:0-7] "; which ranks show depends on the View), with the live table
// kept below them on a terminal, through a TerminalWriter that never blocks
// the event loop: when the terminal does not keep up, lines are dropped and
// counted, and a note says how many. Each line is also written whole to
// <log_dir>/rank-<r>.log, and the last few are kept for the failure report.
// Progress records are checked (size, nesting) and go to
// <log_dir>/metrics.jsonl with rank, node and time added and feed the
// RankBoard; each is shown at most once: in the table, or (lines, rank0)
// rank 0's as a line with control characters escaped. A failed write under
// --log_dir is reported once per file and kept in sink_status(); the job
// goes on. Owned by the Launcher; main thread only.
#pragma once

#include <chrono>
#include <cstdio>
#include <deque>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"
#include "launcher/plan/plan.h"
#include "launcher/report/line_folder.h"
#include "launcher/report/live_table.h"
#include "launcher/report/log_files.h"
#include "launcher/report/progress_sink.h"
#include "launcher/report/rank_board.h"
#include "launcher/report/terminal_writer.h"

namespace dslaunch::launcher {

class Console {
 public:
  static constexpr size_t kKeptLines = 10;
  static constexpr size_t kKeptLineBytes = 4096;
  // Bounds on rank 0's progress line: per field and in all.
  static constexpr size_t kMaxProgressFieldBytes = 160;
  static constexpr size_t kMaxProgressLineBytes = 1024;

  struct Options {
    size_t terminal_limit = TerminalWriter::kDefaultLimit;
    size_t line_memory = RankLog::kDefaultMemoryPerStream;
    std::chrono::milliseconds drain_stall = TerminalWriter::kExitStall;
    std::chrono::milliseconds drain_cap = TerminalWriter::kExitCap;
  };

  // The launcher's stdout and stderr (flushed first: raw writes follow).
  Console(FILE* out, FILE* err);
  Console(int out_fd, int err_fd, Options options);
  ~Console();  // Close(), DrainTerminal()
  Console(const Console&) = delete;
  Console& operator=(const Console&) = delete;

  // What the terminal shows (--console): a live table of nodes (kTable) or
  // ranks (kAll) below every rank's lines; every rank's lines with rank 0's
  // progress (kLines); rank 0's only (kRank0); nothing of the ranks (kNone).
  enum class Mode { kTable, kAll, kLines, kRank0, kNone };
  struct View {
    Mode mode = Mode::kLines;
    bool fold = false;  // identical lines of several ranks shown once
    double fold_window_s = 0.1;
    double redraw_s = 0.25;  // the table at most this often
    bool unicode = true;
  };
  void SetView(const View& view);
  // Called a few times a second (by the Job's watch): lines held for
  // folding go out, the table is redrawn.
  void Tick(double now);

  // Where rank output is written besides the terminal.
  struct LogLayout {
    std::string dir;  // "" = no files
    // Rank r's file is <dir>/<rank_file_prefix><r>.log.
    std::string rank_file_prefix = "rank-";
    // false: rank output goes to the files only (DeepSpeed's
    // --enable_each_rank_log); the launcher's own notes still show.
    bool ranks_on_terminal = true;
    std::string flag = "--log_dir";  // names `dir` in messages
  };
  // Opens the directory (if any; made if missing) by SafeDir's rule of
  // base/safe_files.h, then one log file per rank of `plan` and
  // metrics.jsonl relative to it (SafeDir::OpenLog). Called again before any
  // rank wrote (--launcher join, once the agents joined): hosts are updated and
  // every file made anew.
  Status Open(const Plan& plan, const LogLayout& layout);
  Status Open(const Plan& plan, const std::string& log_dir) {
    return Open(plan, LogLayout{log_dir});
  }
  // Every progress record with a step also goes to `sink` (--tensorboard's
  // TensorBoardSink), flushed about once a second and closed by Close().
  void SetProgressSink(std::unique_ptr<ProgressSink> sink) {
    sink_ = std::move(sink);
  }
  // One piece of a rank's output. `partial`: no newline followed it (a piece
  // of a line longer than the agent's limit, or the end of the stream). The
  // terminal shows every piece as it comes, on a line of its own; the log
  // file gets each line whole.
  void Line(int rank, bool is_stderr, std::string_view line, bool partial);
  // The rank's output is complete (its exit arrived): a last line without a
  // newline, held so far, goes to its log file.
  void EndOfOutput(int rank);
  // A record over the size or nesting bounds is malformed: counted, dropped.
  void Progress(int rank, std::string_view json, double time);
  // The launcher's own message, to stderr, prefixed "dslaunch: ".
  void Note(std::string_view message);
  // The job restarted: generation `restart_count` runs `plan` because of
  // `why` (`cause`: CauseName, e.g. "rank failed", "grow"). The board
  // starts over (every rank pending), metrics.jsonl gets a
  // {"event": "restart", ...} line, the progress sink its restart count.
  void NewGeneration(const Plan& plan, int restart_count,
                     const std::string& why, const std::string& cause);
  // From now on notes are also kept (at most kMaxCaptured), for the
  // failure bundle's report; TakeCaptured returns and forgets them.
  static constexpr size_t kMaxCaptured = 2000;
  void StartCapture() { capturing_ = true; }
  std::vector<std::string> TakeCaptured() { return std::move(captured_); }
  // A line from outside the ranks (an agent's own log over ssh, pdsh's
  // messages), to stderr as it is.
  void Relay(std::string_view line);
  void Flush();
  // Writes what is held and closes the files under --log_dir; write errors
  // land in sink_status(). Lines after Close reach the terminal only.
  void Close();
  // Waits, bounded (Options::drain_stall without progress, drain_cap in
  // all), for the terminal to take every line; then says how many were
  // dropped, if any.
  void DrainTerminal();

  // The first error writing a file under --log_dir; OK when none.
  const Status& sink_status() const { return sink_status_; }
  const std::deque<std::string>& LastLines(int rank) { return last_[rank]; }
  int64_t progress_records() const { return progress_records_; }
  int64_t malformed_progress() const { return malformed_progress_; }
  // Lines the terminal did not take, both streams.
  int64_t dropped_lines() const;
  // What is known of every rank (progress, starts, exits, resources).
  RankBoard& board() { return board_; }
  const RankBoard& board() const { return board_; }
  // For the launcher's log sink (thread-safe, never blocks).
  TerminalWriter& terminal() { return terminal_; }

 private:
  // `text` holds `lines` lines (counted as such when dropped).
  void ToTerminal(TerminalWriter::Stream stream, std::string text,
                  int lines = 1);
  bool TableShown() const {
    return view_.mode == Mode::kTable || view_.mode == Mode::kAll;
  }
  // Writes the held groups whose window passed (all when `all`).
  // Each rank's line prefix and host, from `plan`.
  void NameRanks(const Plan& plan);
  Status OpenRankLogs();
  void FlushFolded(double now, bool all);
  void DrawTable(double now);
  // Notes the lines dropped since the last such note; false if none.
  bool NoteDropped();
  void OnSinkError(const Status& status);
  // Says the progress sink's first error once.
  void CheckSink();

  Options options_;
  TerminalWriter terminal_;
  std::string log_dir_;
  std::shared_ptr<const base::SafeDir> log_files_;  // log_dir_, opened
  std::string rank_file_prefix_;
  bool ranks_on_terminal_ = true;
  std::map<int, std::string> prefix_;  // rank -> "[host:rank] "
  std::map<int, std::string> host_;
  std::map<int, std::unique_ptr<RankLog>> logs_;
  std::unique_ptr<SinkFile> metrics_;
  std::map<int, std::deque<std::string>> last_;
  int64_t progress_records_ = 0;
  int64_t malformed_progress_ = 0;
  int64_t reported_drops_[2] = {0, 0};
  Status sink_status_;
  RankBoard board_;
  std::unique_ptr<ProgressSink> sink_;
  double last_sink_flush_ = 0;
  bool sink_error_said_ = false;
  bool capturing_ = false;
  std::vector<std::string> captured_;
  View view_;
  LineFolder folder_{0.1};
  double last_draw_ = 0;
  bool table_released_ = false;
};

}  // namespace dslaunch::launcher
