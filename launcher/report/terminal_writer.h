// TerminalWriter: writes the console's text to stdout and stderr from threads
// of its own, so that a slow or stopped reader (a pipe nobody reads, Ctrl-S)
// never stalls the launcher's event loop, its heartbeats or its handling of
// Ctrl-C. Write never blocks: past `limit` bytes queued for a stream, lines
// are dropped and counted (drop newest) until the queue has drained to half
// the limit. stdout and stderr share one queue (their order kept) when they
// are the same file; otherwise each has its own, so a stalled stdout never
// holds back stderr and the closing report. Owned by Console; its methods are
// called from one thread (the launcher's main thread).
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

namespace dslaunch::launcher {

class TerminalWriter {
 public:
  enum class Stream { kOut = 0, kErr = 1 };
  enum class Result {
    kQueued,
    kResumed,  // queued, and the lines before it had been dropped
    kDropped,
  };
  static constexpr size_t kDefaultLimit = 64u << 20;
  // Room past the limit kept for the launcher's own notes (WriteNote).
  static constexpr size_t kNoteReserve = 1u << 20;
  // At destruction: give up on a reader that took nothing for kExitStall,
  // or that is still behind after kExitCap.
  static constexpr auto kExitStall = std::chrono::seconds(2);
  static constexpr auto kExitCap = std::chrono::seconds(30);

  TerminalWriter(int out_fd, int err_fd, size_t limit = kDefaultLimit);
  // Drain(kExitStall, kExitCap), then stops; a thread still blocked in
  // write() on a reader that never reads is left behind, never waited for.
  ~TerminalWriter();
  TerminalWriter(const TerminalWriter&) = delete;
  TerminalWriter& operator=(const TerminalWriter&) = delete;

  // Queues one line (or piece of text) of rank output, or `lines` lines
  // (counted as that many when dropped); never blocks.
  Result Write(Stream stream, std::string text, int lines = 1);
  // Queues the launcher's own message even while lines are being dropped,
  // up to limit + kNoteReserve; false when there is no room even so.
  bool WriteNote(Stream stream, std::string text);
  // Waits until everything queued is written, giving up when the reader took
  // nothing for `stall` or `cap` has passed. Returns true when all was
  // written; lines given up on are dropped and counted.
  bool Drain(std::chrono::milliseconds stall, std::chrono::milliseconds cap);
  // The same for one stream's queue only.
  bool DrainStream(Stream stream, std::chrono::milliseconds stall,
                   std::chrono::milliseconds cap);
  // The live footer of `stream` (text of whole lines, each narrower than
  // the terminal): from now on it stays below everything written to this
  // stream's queue, redrawn after each batch; a new one replaces it on the
  // screen. Only for a terminal.
  void SetFooter(Stream stream, std::string footer);
  // The footer stops being managed: the last one drawn (or set) stays on
  // the screen as it is and later text goes below it.
  void ReleaseFooter(Stream stream);
  int fd(Stream stream) const { return fds_[static_cast<int>(stream)]; }
  // Lines dropped so far (given to Write, never written).
  int64_t dropped(Stream stream) const;

  struct Lane;  // a queue and its thread; defined in terminal_writer.cc

 private:
  Lane& LaneOf(Stream stream) const;

  int fds_[2];
  std::shared_ptr<Lane> lanes_[2];  // one object twice when shared
};

}  // namespace dslaunch::launcher
