// TerminalWriter: writes the console's text to stdout/stderr from a thread
// of its own, so that a slow reader (a pipe into `less`, Ctrl-S on a
// terminal) never stalls the launcher's event loop, its heartbeats or its
// handling of Ctrl-C. Order across both streams is kept. Past `limit`
// bytes queued, Write blocks: memory stays bounded. Write and Drain may be
// called from any one thread.
#pragma once

#include <condition_variable>
#include <cstdio>
#include <deque>
#include <mutex>
#include <string>
#include <thread>
#include <utility>

namespace dslaunch::launcher {

class TerminalWriter {
 public:
  explicit TerminalWriter(size_t limit = 64u << 20);
  ~TerminalWriter();  // writes what is queued, then stops
  TerminalWriter(const TerminalWriter&) = delete;
  TerminalWriter& operator=(const TerminalWriter&) = delete;

  void Write(FILE* stream, std::string text);
  // Returns once everything queued so far is written and flushed.
  void Drain();

 private:
  void Run();

  const size_t limit_;
  std::mutex mu_;
  std::condition_variable cv_;
  // State below is protected by mu_.
  std::deque<std::pair<FILE*, std::string>> queue_;
  size_t queued_bytes_ = 0;
  bool writing_ = false;
  bool stop_ = false;
  std::thread thread_;  // last: starts after the state above exists
};

}  // namespace dslaunch::launcher
