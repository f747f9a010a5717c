// TerminalLogSink: the launcher's spdlog sink. Its log lines go through the
// Console's TerminalWriter like every other line on the terminal, so a
// stalled stderr never blocks the event loop on a log call. The writer must
// outlive the sink's use: the Launcher installs it for the life of Run().
// Any thread (spdlog's mutex, then the writer's).
#pragma once

#include <spdlog/sinks/base_sink.h>

#include <mutex>
#include <string>

#include "launcher/report/terminal_writer.h"

namespace dslaunch::launcher {

class TerminalLogSink : public spdlog::sinks::base_sink<std::mutex> {
 public:
  explicit TerminalLogSink(TerminalWriter* terminal) : terminal_(terminal) {}

 protected:
  void sink_it_(const spdlog::details::log_msg& msg) override {
    spdlog::memory_buf_t line;
    formatter_->format(msg, line);
    terminal_->WriteNote(TerminalWriter::Stream::kErr,
                         std::string(line.data(), line.size()));
  }
  void flush_() override {}

 private:
  TerminalWriter* terminal_;
};

}  // namespace dslaunch::launcher
