#include "launcher/report/terminal_writer.h"

#include <errno.h>
#include <pthread.h>  // pthread_sigmask: signals stay with the main thread
#include <signal.h>
#include <sys/stat.h>  // fstat: are stdout and stderr the same file?
#include <unistd.h>    // write

#include <algorithm>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <string_view>
#include <thread>

namespace dslaunch::launcher {

namespace {

constexpr size_t kChunkBytes = 16u << 10;   // one write(); progress unit
constexpr size_t kBatchBytes = 256u << 10;  // coalesced per write loop
// With a footer, writes (and redraws) at most about this often.
constexpr auto kFooterGather = std::chrono::milliseconds(20);

int Index(TerminalWriter::Stream s) { return static_cast<int>(s); }

}  // namespace

// One queue and the detached thread that empties it. Shared with that
// thread, which may outlive the TerminalWriter when blocked in write().
struct TerminalWriter::Lane {
  // One write to make, or a mark in order with them.
  struct Entry {
    int fd;
    int stream;  // index into dropped
    bool note;   // the launcher's own message: never counted as dropped
    std::string text;
    bool release_footer = false;  // ReleaseFooter's mark, in order with text
    int lines = 1;                // counted when dropped
  };

  explicit Lane(size_t limit) : limit(limit) {}
  const size_t limit;
  std::mutex mu;
  std::condition_variable cv;
  // State below is protected by mu.
  std::deque<Entry> queue;
  size_t queued_bytes = 0;  // in the queue and in flight
  uint64_t written_bytes = 0;
  bool in_flight = false;
  bool dropping = false;  // since the queue was full, until it is half empty
  bool broken = false;    // a write failed (EPIPE): everything is dropped
  bool stop = false;
  int64_t dropped[2] = {0, 0};
  // written_bytes when a Drain last gave up: a reader that has taken
  // nothing since is not waited for again.
  uint64_t gave_up_at = UINT64_MAX;
  // The live footer (the console's table): kept below everything written,
  // erased before each batch and drawn again after it.
  int footer_fd = -1;
  std::string footer;
  int footer_lines = 0;  // lines of `footer`
  int footer_shown = 0;  // lines of the footer now on the screen
  bool footer_dirty = false;
  std::chrono::steady_clock::time_point footer_drawn{};

  // REQUIRES: mu is held. Drops the queued lines, counting them.
  void DiscardQueue() {
    for (const Entry& e : queue) {
      if (!e.note) dropped[e.stream] += e.lines;
      queued_bytes -= e.text.size();
    }
    queue.clear();
  }
};

namespace {

// Writes `data` to `fd` in chunks, recording progress; false on an error.
bool WriteAll(TerminalWriter::Lane& lane, int fd, std::string_view data) {
  while (!data.empty()) {
    const ssize_t n =
        ::write(fd, data.data(), std::min(data.size(), kChunkBytes));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    data.remove_prefix(static_cast<size_t>(n));
    std::lock_guard<std::mutex> lock(lane.mu);
    lane.written_bytes += static_cast<uint64_t>(n);
    lane.cv.notify_all();
    if (lane.stop) return true;  // abandoned at exit
  }
  return true;
}

// Cursor up over the footer now shown, to the start of its first line, and
// erase to the end of the screen.
std::string EraseFooter(int shown) {
  if (shown == 0) return {};
  return "\r\x1b[" + std::to_string(shown) + "A\x1b[J";
}

// REQUIRES: lane.mu is held. Writes the batch with the footer erased
// before it and drawn after it; unlocks around the writes.
bool WriteWithFooter(TerminalWriter::Lane& lane,
                     std::unique_lock<std::mutex>& lock, int fd,
                     const std::string& batch) {
  const int footer_fd = lane.footer_fd;
  std::string before = EraseFooter(lane.footer_shown);
  std::string after = lane.footer;
  lane.footer_shown = lane.footer_lines;
  lane.footer_dirty = false;
  lane.footer_drawn = std::chrono::steady_clock::now();
  lane.in_flight = true;
  lock.unlock();
  bool ok = true;
  if (footer_fd == fd) {
    ok = WriteAll(lane, fd, before + batch + after);
  } else {
    ok = WriteAll(lane, footer_fd, before) && WriteAll(lane, fd, batch) &&
         WriteAll(lane, footer_fd, after);
  }
  lock.lock();
  lane.in_flight = false;
  return ok;
}

// REQUIRES: lane.mu is held. The footer's latest text is drawn, if it is
// not on the screen yet, and is left there: later text goes below it.
void ReleaseFooterNow(TerminalWriter::Lane& lane,
                      std::unique_lock<std::mutex>& lock) {
  if (lane.footer_fd < 0) return;
  if (lane.footer_dirty && !lane.broken)
    (void)WriteWithFooter(lane, lock, lane.footer_fd, "");
  lane.footer_fd = -1;
  lane.footer.clear();
  lane.footer_lines = 0;
  lane.footer_shown = 0;
  lane.footer_dirty = false;
}

void RunLane(std::shared_ptr<TerminalWriter::Lane> lane) {
  std::unique_lock<std::mutex> lock(lane->mu);
  while (true) {
    lane->cv.wait(lock, [&] {
      return !lane->queue.empty() || lane->footer_dirty || lane->stop;
    });
    if (lane->stop) return;
    if (lane->footer_fd >= 0) {
      // Each write erases and redraws the footer: lines that come fast are
      // gathered for a moment into fewer, larger writes.
      lane->cv.wait_until(lock, lane->footer_drawn + kFooterGather, [&] {
        return lane->stop || lane->queued_bytes >= kBatchBytes;
      });
      if (lane->stop) return;
    }
    if (!lane->queue.empty() && lane->queue.front().release_footer) {
      lane->queue.pop_front();
      ReleaseFooterNow(*lane, lock);
      continue;
    }
    // Consecutive entries for one descriptor go out in one write loop.
    const int fd =
        lane->queue.empty() ? lane->footer_fd : lane->queue.front().fd;
    std::string batch;
    while (!lane->queue.empty() && lane->queue.front().fd == fd &&
           !lane->queue.front().release_footer && batch.size() < kBatchBytes) {
      batch += lane->queue.front().text;
      lane->queue.pop_front();
    }
    bool ok = true;
    if (lane->footer_fd >= 0 && !lane->broken) {
      ok = WriteWithFooter(*lane, lock, fd, batch);
    } else {
      lane->footer_dirty = false;
      lane->in_flight = true;
      lock.unlock();
      ok = WriteAll(*lane, fd, batch);
      lock.lock();
      lane->in_flight = false;
    }
    lane->queued_bytes -= batch.size();
    if (!ok) {
      lane->broken = true;
      lane->DiscardQueue();
    }
    lane->cv.notify_all();
  }
}

bool SameFile(int a, int b) {
  struct stat sa, sb;
  if (::fstat(a, &sa) != 0 || ::fstat(b, &sb) != 0) return false;
  return sa.st_dev == sb.st_dev && sa.st_ino == sb.st_ino;
}

// Waits for `lane` to empty; see TerminalWriter::Drain.
bool DrainLane(TerminalWriter::Lane& lane, std::chrono::milliseconds stall,
               std::chrono::steady_clock::time_point deadline) {
  using Clock = std::chrono::steady_clock;
  std::unique_lock<std::mutex> lock(lane.mu);
  uint64_t seen = lane.written_bytes;
  auto last_progress = Clock::now();
  if (seen == lane.gave_up_at && lane.in_flight) {
    lane.DiscardQueue();
    return false;
  }
  while (!lane.queue.empty() || lane.in_flight) {
    lane.cv.wait_until(lock, std::min(last_progress + stall, deadline));
    const auto now = Clock::now();
    if (lane.written_bytes != seen) {
      seen = lane.written_bytes;
      last_progress = now;
    }
    if ((now >= deadline || now >= last_progress + stall) &&
        (!lane.queue.empty() || lane.in_flight)) {
      lane.DiscardQueue();
      lane.gave_up_at = lane.written_bytes;
      return false;
    }
  }
  return !lane.broken;
}

}  // namespace

TerminalWriter::TerminalWriter(int out_fd, int err_fd, size_t limit)
    : fds_{out_fd, err_fd} {
  lanes_[0] = std::make_shared<Lane>(limit);
  lanes_[1] =
      SameFile(out_fd, err_fd) ? lanes_[0] : std::make_shared<Lane>(limit);
  // The threads block every signal, so signals reach the event loop.
  sigset_t all, old;
  sigfillset(&all);
  pthread_sigmask(SIG_BLOCK, &all, &old);
  std::thread(RunLane, lanes_[0]).detach();
  if (lanes_[1] != lanes_[0]) std::thread(RunLane, lanes_[1]).detach();
  pthread_sigmask(SIG_SETMASK, &old, nullptr);
}

TerminalWriter::~TerminalWriter() {
  Drain(kExitStall, kExitCap);
  for (const auto& lane : lanes_) {
    std::lock_guard<std::mutex> lock(lane->mu);
    lane->stop = true;
    lane->cv.notify_all();
  }
}

TerminalWriter::Lane& TerminalWriter::LaneOf(Stream stream) const {
  return *lanes_[Index(stream)];
}

TerminalWriter::Result TerminalWriter::Write(Stream stream, std::string text,
                                             int lines) {
  Lane& lane = LaneOf(stream);
  std::lock_guard<std::mutex> lock(lane.mu);
  bool resumed = false;
  if (lane.dropping && lane.queued_bytes <= lane.limit / 2) {
    lane.dropping = false;
    resumed = true;
  }
  if (lane.broken || lane.dropping ||
      lane.queued_bytes + text.size() > lane.limit) {
    lane.dropping = !lane.broken;
    lane.dropped[Index(stream)] += lines;
    return Result::kDropped;
  }
  lane.queued_bytes += text.size();
  lane.queue.push_back(
      Lane::Entry{fds_[Index(stream)], Index(stream), false, std::move(text)});
  lane.queue.back().lines = lines;
  lane.cv.notify_all();
  return resumed ? Result::kResumed : Result::kQueued;
}

bool TerminalWriter::WriteNote(Stream stream, std::string text) {
  Lane& lane = LaneOf(stream);
  std::lock_guard<std::mutex> lock(lane.mu);
  if (lane.broken ||
      lane.queued_bytes + text.size() > lane.limit + kNoteReserve) {
    return false;
  }
  lane.queued_bytes += text.size();
  lane.queue.push_back(
      Lane::Entry{fds_[Index(stream)], Index(stream), true, std::move(text)});
  lane.cv.notify_all();
  return true;
}

bool TerminalWriter::Drain(std::chrono::milliseconds stall,
                           std::chrono::milliseconds cap) {
  const auto deadline = std::chrono::steady_clock::now() + cap;
  bool all = DrainLane(*lanes_[0], stall, deadline);
  if (lanes_[1] != lanes_[0]) {
    all = DrainLane(*lanes_[1], stall, deadline) && all;
  }
  return all;
}

bool TerminalWriter::DrainStream(Stream stream, std::chrono::milliseconds stall,
                                 std::chrono::milliseconds cap) {
  return DrainLane(LaneOf(stream), stall,
                   std::chrono::steady_clock::now() + cap);
}

void TerminalWriter::SetFooter(Stream stream, std::string footer) {
  Lane& lane = LaneOf(stream);
  std::lock_guard<std::mutex> lock(lane.mu);
  lane.footer_lines =
      static_cast<int>(std::count(footer.begin(), footer.end(), '\n'));
  lane.footer = std::move(footer);
  lane.footer_fd = fds_[Index(stream)];
  lane.footer_dirty = true;
  lane.cv.notify_all();
}

void TerminalWriter::ReleaseFooter(Stream stream) {
  Lane& lane = LaneOf(stream);
  std::lock_guard<std::mutex> lock(lane.mu);
  if (lane.footer_fd < 0) return;
  Lane::Entry mark{lane.footer_fd, Index(stream), true, ""};
  mark.release_footer = true;
  lane.queue.push_back(std::move(mark));
  lane.cv.notify_all();
}

int64_t TerminalWriter::dropped(Stream stream) const {
  Lane& lane = LaneOf(stream);
  std::lock_guard<std::mutex> lock(lane.mu);
  return lane.dropped[Index(stream)];
}

}  // namespace dslaunch::launcher
