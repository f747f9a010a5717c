#include "launcher/report/terminal_writer.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <string>
#include <thread>

#include "tests/common/temp_fd.h"

namespace dslaunch::launcher {
namespace {

using dslaunch::testing::ReadFd;
using dslaunch::testing::TempFd;

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;
using Stream = TerminalWriter::Stream;
using Result = TerminalWriter::Result;

struct Pipe {
  Pipe() { EXPECT_EQ(::pipe2(fds, O_CLOEXEC), 0); }
  ~Pipe() {
    if (fds[0] >= 0) ::close(fds[0]);
    ::close(fds[1]);
  }
  void CloseReadEnd() {
    ::close(fds[0]);
    fds[0] = -1;
  }
  int fds[2];
};

double Seconds(Clock::duration d) {
  return std::chrono::duration<double>(d).count();
}

TEST(TerminalWriter, KeepsOrderAcrossStreamsThatAreOneFile) {
  const int fd = TempFd();
  std::string want;
  {
    TerminalWriter writer(fd, fd, /*limit=*/1 << 20);
    for (int i = 0; i < 2000; ++i) {
      std::string line = "line " + std::to_string(i) + "\n";
      want += line;
      EXPECT_NE(writer.Write(i % 3 ? Stream::kOut : Stream::kErr, line),
                Result::kDropped);
    }
    EXPECT_TRUE(writer.Drain(milliseconds(2000), milliseconds(10000)));
    EXPECT_EQ(ReadFd(fd), want);
    writer.Write(Stream::kOut, "tail\n");
  }  // the destructor writes what is still queued
  EXPECT_EQ(ReadFd(fd), want + "tail\n");
  ::close(fd);
}

TEST(TerminalWriter, DropsNewestInsteadOfBlockingOnAReaderThatDoesNotRead) {
  Pipe pipe;  // nobody reads it: the pipe fills, then the queue
  const int err = TempFd();
  TerminalWriter writer(pipe.fds[1], err, /*limit=*/1 << 20);
  const std::string line(1000, 'x');
  const auto start = Clock::now();
  int queued = 0;
  for (int i = 0; i < 20000; ++i) {  // 20 MB, far past pipe and limit
    if (writer.Write(Stream::kOut, line + "\n") != Result::kDropped) ++queued;
  }
  EXPECT_LT(Seconds(Clock::now() - start), 2.0);
  EXPECT_GT(writer.dropped(Stream::kOut), 18000);
  EXPECT_EQ(writer.dropped(Stream::kOut) + queued, 20000);
  EXPECT_EQ(writer.dropped(Stream::kErr), 0);
  EXPECT_FALSE(writer.Drain(milliseconds(200), milliseconds(5000)));
  // Lines still queued when Drain gave up count as dropped too.
  EXPECT_GT(writer.dropped(Stream::kOut) + queued, 20000);
  ::close(err);
}

TEST(TerminalWriter, StalledStdoutDoesNotHoldBackStderr) {
  Pipe pipe;
  const int err = TempFd();
  TerminalWriter writer(pipe.fds[1], err, /*limit=*/64 << 10);
  for (int i = 0; i < 1000; ++i)
    writer.Write(Stream::kOut, std::string(999, 'o') + "\n");
  writer.Write(Stream::kErr, "error line\n");
  ASSERT_TRUE(writer.WriteNote(Stream::kErr, "dslaunch: report\n"));
  EXPECT_TRUE(
      writer.DrainStream(Stream::kErr, milliseconds(2000), milliseconds(5000)));
  EXPECT_EQ(ReadFd(err), "error line\ndslaunch: report\n");
  ::close(err);
}

TEST(TerminalWriter, SaysWhenItResumesAfterDropping) {
  Pipe pipe;
  // The pipe is full before the writer starts: nothing it queues can leave
  // until the reader below runs, however the threads are scheduled.
  const int flags = ::fcntl(pipe.fds[1], F_GETFL);
  ASSERT_EQ(::fcntl(pipe.fds[1], F_SETFL, flags | O_NONBLOCK), 0);
  const std::string fill(4096, 'f');
  size_t filled = 0;
  for (ssize_t n; (n = ::write(pipe.fds[1], fill.data(), fill.size())) > 0;)
    filled += static_cast<size_t>(n);
  ASSERT_EQ(::fcntl(pipe.fds[1], F_SETFL, flags), 0);
  const int err = TempFd();
  TerminalWriter writer(pipe.fds[1], err, /*limit=*/64 << 10);
  const std::string line = std::string(999, 'x') + "\n";
  while (writer.Write(Stream::kOut, line) != Result::kDropped) {
  }
  // Still full: notes get through, lines do not.
  EXPECT_TRUE(writer.WriteNote(Stream::kOut, "note\n"));
  EXPECT_EQ(writer.Write(Stream::kOut, line), Result::kDropped);
  // The reader catches up: everything queued is written.
  std::string got;
  std::thread reader([&] {
    char buf[65536];
    ssize_t n;
    while ((n = ::read(pipe.fds[0], buf, sizeof(buf))) > 0) got.append(buf, n);
  });
  EXPECT_TRUE(writer.Drain(milliseconds(2000), milliseconds(10000)));
  EXPECT_EQ(writer.Write(Stream::kOut, "after\n"), Result::kResumed);
  EXPECT_EQ(writer.Write(Stream::kOut, "more\n"), Result::kQueued);
  EXPECT_TRUE(writer.Drain(milliseconds(2000), milliseconds(10000)));
  ::close(pipe.fds[1]);
  pipe.fds[1] = ::open("/dev/null", O_WRONLY);  // for ~Pipe
  reader.join();
  ASSERT_GE(got.size(), filled);
  EXPECT_EQ(got.substr(0, filled), std::string(filled, 'f'));
  got.erase(0, filled);
  EXPECT_EQ(got.size() % line.size(), 5 + 6 + 5);  // note, after, more
  EXPECT_EQ(got.substr(got.size() - 11), "after\nmore\n");
  EXPECT_EQ(writer.dropped(Stream::kOut), 2);
  ::close(err);
}

TEST(TerminalWriter, DestructorDoesNotHangOnAReaderThatNeverReads) {
  Pipe pipe;
  const auto start = Clock::now();
  {
    TerminalWriter writer(pipe.fds[1], pipe.fds[1], /*limit=*/1 << 20);
    for (int i = 0; i < 1000; ++i)
      writer.Write(Stream::kOut, std::string(1000, 'y'));
  }
  const double took = Seconds(Clock::now() - start);
  EXPECT_LT(took, Seconds(TerminalWriter::kExitStall) + 1.5);
}

TEST(TerminalWriter, DropsAndCountsWhenTheReaderIsGone) {
  ::signal(SIGPIPE, SIG_IGN);  // as the launcher does
  Pipe pipe;
  pipe.CloseReadEnd();
  TerminalWriter writer(pipe.fds[1], pipe.fds[1], /*limit=*/1 << 20);
  for (int i = 0; i < 100; ++i) writer.Write(Stream::kOut, "line\n");
  EXPECT_FALSE(writer.Drain(milliseconds(2000), milliseconds(5000)));
  // Whatever was not written is counted; a write after that is dropped.
  EXPECT_EQ(writer.Write(Stream::kOut, "late\n"), Result::kDropped);
  EXPECT_GE(writer.dropped(Stream::kOut), 1);
}

}  // namespace
}  // namespace dslaunch::launcher
