#include "launcher/report/console.h"

#include <sys/ioctl.h>  // TIOCGWINSZ: the table's width and height

#include <chrono>
#include <nlohmann/json.hpp>  // rank 0's progress line

#include "base/unix_time.h"
#include "proto/progress.h"

namespace dslaunch::launcher {

namespace {

using Stream = TerminalWriter::Stream;

int FdOf(FILE* f) {
  std::fflush(f);
  return fileno(f);
}

// `text` cut to at most `limit` bytes on a UTF-8 character boundary.
std::string Clip(std::string text, size_t limit) {
  if (text.size() <= limit) return text;
  size_t n = limit;
  while (n > 0 && (static_cast<unsigned char>(text[n]) & 0xC0) == 0x80) --n;
  text.resize(n);
  return text + "...";
}

// "key value  key value ..." of a validated record (nesting bounded),
// bounded in size and safe for a terminal.
std::string ProgressSummary(std::string_view json) {
  const auto record = nlohmann::ordered_json::parse(json, nullptr, false);
  if (!record.is_object()) return {};
  std::string out;
  for (const auto& [key, value] : record.items()) {
    if (out.size() >= Console::kMaxProgressLineBytes) {
      out += "  ...";
      break;
    }
    if (!out.empty()) out += "  ";
    const std::string text =
        value.is_string() ? value.get<std::string>() : proto::DumpJson(value);
    out += Clip(key, Console::kMaxProgressFieldBytes) + " " +
           Clip(text, Console::kMaxProgressFieldBytes);
  }
  return proto::EscapeControlChars(out);
}

}  // namespace

Console::Console(FILE* out, FILE* err)
    : Console(FdOf(out), FdOf(err), Options()) {}

Console::Console(int out_fd, int err_fd, Options options)
    : options_(options), terminal_(out_fd, err_fd, options.terminal_limit) {}

Console::~Console() {
  Close();
  DrainTerminal();
}

void Console::NameRanks(const Plan& plan) {
  for (const auto& node : plan.nodes) {
    for (size_t i = 0; i < node.slots.size(); ++i) {
      const int rank = node.first_rank + static_cast<int>(i);
      prefix_[rank] = "[" + node.host + ":" + std::to_string(rank) + "] ";
      host_[rank] = node.host;
    }
  }
}

Status Console::Open(const Plan& plan, const LogLayout& layout) {
  const std::string& log_dir = layout.dir;
  ranks_on_terminal_ = layout.ranks_on_terminal;
  board_.Reset(plan);
  NameRanks(plan);
  if (log_dir.empty()) return Status::Ok();
  // Opened once: every file below is made relative to this descriptor.
  ASSIGN_OR_RETURN(base::SafeDir opened, OpenLogDir(log_dir, layout.flag));
  log_files_ = std::make_shared<const base::SafeDir>(std::move(opened));
  log_dir_ = log_dir;
  rank_file_prefix_ = layout.rank_file_prefix;
  RETURN_IF_ERROR(OpenRankLogs());
  ASSIGN_OR_RETURN(metrics_, SinkFile::Create(*log_files_, "metrics.jsonl",
                                              [this](const Status& st) {
                                                OnSinkError(st);
                                              }));
  return Status::Ok();
}

// Every named rank's log that is not open yet (a generation may have more
// ranks than the first).
Status Console::OpenRankLogs() {
  if (!log_files_) return Status::Ok();
  auto on_error = [this](const Status& st) { OnSinkError(st); };
  for (const auto& [rank, prefix] : prefix_) {
    if (logs_.count(rank)) continue;
    const std::string name = rank_file_prefix_ + std::to_string(rank) + ".log";
    ASSIGN_OR_RETURN(auto file, SinkFile::Create(*log_files_, name, on_error));
    logs_[rank] = std::make_unique<RankLog>(std::move(file), log_files_,
                                            options_.line_memory);
  }
  return Status::Ok();
}

void Console::NewGeneration(const Plan& plan, int restart_count,
                            const std::string& why, const std::string& cause) {
  board_.Reset(plan);
  board_.set_restarts(restart_count);
  NameRanks(plan);  // a node may run elsewhere now
  if (Status st = OpenRankLogs(); !st.ok()) OnSinkError(st);
  const double now = base::UnixSeconds();
  if (sink_) sink_->Restart(restart_count, now);
  if (!metrics_) return;
  nlohmann::ordered_json hosts = nlohmann::ordered_json::array();
  for (const auto& node : plan.nodes) hosts.push_back(node.host);
  nlohmann::ordered_json event = {
      {"event", "restart"}, {"restart_count", restart_count},
      {"cause", cause},     {"reason", why},
      {"nodes", hosts},     {"world_size", plan.world_size},
      {"time", now}};
  metrics_->Append(proto::DumpJson(event) + "\n");
}

void Console::SetView(const View& view) {
  view_ = view;
  folder_ = LineFolder(view.fold_window_s);
}

void Console::Line(int rank, bool is_stderr, std::string_view line,
                   bool partial) {
  const bool shown = ranks_on_terminal_ && view_.mode != Mode::kNone &&
                     (view_.mode != Mode::kRank0 || rank == 0);
  if (shown && view_.fold && view_.mode != Mode::kRank0) {
    if (folder_.Add(rank, is_stderr, line, base::SteadySeconds()))
      FlushFolded(0, true);
  } else if (shown) {
    std::string text = prefix_[rank];
    text.append(line);
    text.push_back('\n');
    ToTerminal(is_stderr ? Stream::kErr : Stream::kOut, std::move(text));
  }
  if (auto it = logs_.find(rank); it != logs_.end()) {
    it->second->Piece(is_stderr, line, !partial);
  }
  auto& last = last_[rank];
  // Kept for the failure report: bounded per line, so that many ranks of
  // long lines cannot fill the launcher's memory.
  last.emplace_back(line.substr(0, kKeptLineBytes));
  if (last.size() > kKeptLines) last.pop_front();
}

void Console::EndOfOutput(int rank) {
  if (auto it = logs_.find(rank); it != logs_.end()) {
    it->second->EndOfOutput();
  }
}

void Console::Progress(int rank, std::string_view json, double time) {
  ++progress_records_;
  if (!proto::ValidateProgressRecord(json).ok()) {
    ++malformed_progress_;
    return;
  }
  const auto record = nlohmann::ordered_json::parse(json, nullptr, false);
  // The board compares with this host's clock (hangs, "seen"): records are
  // stamped on arrival, whatever the agent's clock says.
  board_.Record(rank, record, base::SteadySeconds());
  if (sink_ && record.is_object() && record.contains("step") &&
      record["step"].is_number()) {
    // The board keeps the last good step: this record's must be that one.
    const auto it = board_.ranks().find(rank);
    if (it != board_.ranks().end() && it->second.step &&
        double(*it->second.step) == record["step"].get<double>())
      sink_->Record(rank, *it->second.step, it->second.scalars, time);
  }
  if (metrics_) {
    std::string line =
        proto::AnnotateProgressRecord(json, rank, host_[rank], time);
    line.push_back('\n');
    metrics_->Append(line);
  }
  const bool as_line = view_.mode == Mode::kLines || view_.mode == Mode::kRank0;
  if (rank == 0 && as_line && ranks_on_terminal_) {
    FlushFolded(0, true);  // after the lines that came before it
    ToTerminal(Stream::kErr, "[" + host_[rank] + ":0 progress] " +
                                 ProgressSummary(json) + "\n");
  }
}

void Console::FlushFolded(double now, bool all) {
  // Consecutive lines of one stream go to the terminal as one piece.
  constexpr size_t kPieceBytes = 64u << 10;
  std::string piece;
  int lines = 0;
  bool piece_is_stderr = false;
  auto send = [&] {
    if (lines == 0) return;
    ToTerminal(piece_is_stderr ? Stream::kErr : Stream::kOut, std::move(piece),
               lines);
    piece.clear();
    lines = 0;
  };
  for (auto& group : folder_.Take(now, all)) {
    if (lines > 0 &&
        (group.is_stderr != piece_is_stderr || piece.size() >= kPieceBytes))
      send();
    piece_is_stderr = group.is_stderr;
    if (group.ranks.size() == 1) {
      piece += prefix_[group.ranks.front()];
    } else {
      piece += FoldedPrefix(std::move(group.ranks), host_);
    }
    piece += group.text;
    piece.push_back('\n');
    ++lines;
  }
  send();
}

void Console::Tick(double now) {
  if (!folder_.empty()) FlushFolded(now, false);
  if (sink_ && now - last_sink_flush_ >= 1.0) {
    last_sink_flush_ = now;
    sink_->Flush();
    CheckSink();
  }
  if (TableShown() && !table_released_ && now - last_draw_ >= view_.redraw_s)
    DrawTable(now);
}

void Console::DrawTable(double now) {
  last_draw_ = now;
  TableStyle style;
  style.unicode = view_.unicode;
  style.per_rank = view_.mode == Mode::kAll;
  struct winsize size {};
  if (::ioctl(terminal_.fd(Stream::kErr), TIOCGWINSZ, &size) == 0 &&
      size.ws_col > 0 && size.ws_row > 0) {
    style.width = size.ws_col;
    // At most half the screen; a terminal too small for a header, a row and
    // the bar below some output gets no table (a footer taller than the
    // screen could not be erased).
    style.max_rows = std::max(1, size.ws_row / 2 - 3);
    if (size.ws_row < 8) return terminal_.SetFooter(Stream::kErr, "");
  }
  terminal_.SetFooter(Stream::kErr, RenderLiveTable(board_, now, style));
}

void Console::Note(std::string_view message) {
  if (!folder_.empty()) FlushFolded(0, true);
  if (capturing_ && captured_.size() < kMaxCaptured)
    captured_.emplace_back(message);
  std::string text = "dslaunch: ";
  text.append(message);
  text.push_back('\n');
  terminal_.WriteNote(Stream::kErr, std::move(text));
}

void Console::Relay(std::string_view line) {
  if (!folder_.empty()) FlushFolded(0, true);
  std::string text(line);
  text.push_back('\n');
  ToTerminal(Stream::kErr, std::move(text));
}

void Console::Flush() {
  // Log files here; the terminal is written by its own threads.
  for (auto& [rank, log] : logs_) log->file().Flush();
  if (metrics_) metrics_->Flush();
}

void Console::Close() {
  if (!folder_.empty()) FlushFolded(0, true);
  if (TableShown() && !table_released_) {
    // The final state stays on the screen above the report.
    DrawTable(base::SteadySeconds());
    terminal_.ReleaseFooter(Stream::kErr);
    table_released_ = true;
  }
  if (sink_) {
    sink_->Close();
    CheckSink();
    sink_.reset();
  }
  logs_.clear();  // each writes what it holds and closes its file
  if (metrics_) metrics_->Close();
  metrics_.reset();
}

void Console::DrainTerminal() {
  terminal_.Drain(options_.drain_stall, options_.drain_cap);
  if (NoteDropped()) {
    terminal_.DrainStream(Stream::kErr, options_.drain_stall,
                          options_.drain_stall);
  }
}

int64_t Console::dropped_lines() const {
  return terminal_.dropped(Stream::kOut) + terminal_.dropped(Stream::kErr);
}

void Console::ToTerminal(Stream stream, std::string text, int lines) {
  if (terminal_.Write(stream, std::move(text), lines) ==
      TerminalWriter::Result::kResumed) {
    NoteDropped();
  }
}

bool Console::NoteDropped() {
  const int64_t out = terminal_.dropped(Stream::kOut) - reported_drops_[0];
  const int64_t err = terminal_.dropped(Stream::kErr) - reported_drops_[1];
  if (out + err == 0) return false;
  reported_drops_[0] += out;
  reported_drops_[1] += err;
  std::string where =
      log_dir_.empty() ? "; --log_dir keeps every line"
      : sink_status_.ok()
          ? "; rank logs in " + log_dir_ + " are complete"
          : "; rank logs in " + log_dir_ + " hold them (but see above)";
  Note(std::to_string(out + err) + " console lines dropped (" +
       std::to_string(out) + " stdout, " + std::to_string(err) +
       " stderr: the terminal did not keep up)" + where);
  return true;
}

void Console::CheckSink() {
  if (sink_error_said_ || sink_->status().ok()) return;
  sink_error_said_ = true;
  OnSinkError(sink_->status());
}

void Console::OnSinkError(const Status& status) {
  if (sink_status_.ok()) sink_status_ = status;
  Note(status.message() + " (the file is incomplete; the job goes on)");
}

}  // namespace dslaunch::launcher
