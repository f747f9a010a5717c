// The live footer of TerminalWriter (the console's table), seen through a
// pipe: the bytes a terminal would get.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <string>
#include <vector>

#include "launcher/report/terminal_writer.h"

namespace dslaunch::launcher {
namespace {

using std::chrono::milliseconds;
using Stream = TerminalWriter::Stream;

struct Pipe {
  Pipe() { EXPECT_EQ(::pipe2(fds, O_CLOEXEC), 0); }
  ~Pipe() {
    ::close(fds[0]);
    ::close(fds[1]);
  }
  int read_fd() const { return fds[0]; }
  int write_fd() const { return fds[1]; }
  int fds[2];
};

// Reads until `n` bytes came or `timeout` passed without any.
std::string ReadBytes(int fd, size_t n, int timeout_ms = 2000) {
  std::string out;
  char buf[4096];
  while (out.size() < n) {
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, timeout_ms) <= 0) break;
    const ssize_t got = ::read(fd, buf, std::min(sizeof(buf), n - out.size()));
    if (got <= 0) break;
    out.append(buf, static_cast<size_t>(got));
  }
  return out;
}

// Whatever comes within `wait_ms` (for "nothing more was written").
std::string ReadMore(int fd, int wait_ms = 150) {
  std::string out;
  char buf[4096];
  pollfd p{fd, POLLIN, 0};
  while (::poll(&p, 1, wait_ms) > 0) {
    const ssize_t got = ::read(fd, buf, sizeof(buf));
    if (got <= 0) break;
    out.append(buf, static_cast<size_t>(got));
  }
  return out;
}

std::string Erase(int lines) {
  return "\r\x1b[" + std::to_string(lines) + "A\x1b[J";
}

// The lines a terminal shows after `bytes`: text, '\n', '\r', ESC[nA
// (cursor up) and ESC[J (erase to the end of the screen).
std::vector<std::string> Screen(const std::string& bytes) {
  std::vector<std::string> lines(1);
  size_t row = 0, col = 0;
  for (size_t i = 0; i < bytes.size(); ++i) {
    const char c = bytes[i];
    if (c == '\n') {
      ++row;
      col = 0;
      if (lines.size() <= row) lines.resize(row + 1);
    } else if (c == '\r') {
      col = 0;
    } else if (c == '\x1b' && i + 1 < bytes.size() && bytes[i + 1] == '[') {
      size_t j = i + 2;
      int n = 0;
      while (j < bytes.size() && isdigit(static_cast<unsigned char>(bytes[j])))
        n = n * 10 + (bytes[j++] - '0');
      if (j >= bytes.size()) break;
      if (bytes[j] == 'A') {
        row -= std::min<size_t>(row, n == 0 ? 1 : n);
      } else if (bytes[j] == 'J') {
        lines[row].resize(std::min(lines[row].size(), col));
        lines.resize(row + 1);
      } else {
        ADD_FAILURE() << "unexpected escape " << bytes.substr(i, j - i + 1);
      }
      i = j;
    } else {
      std::string& line = lines[row];
      if (line.size() <= col) line.resize(col + 1, ' ');
      line[col++] = c;
    }
  }
  if (!lines.empty() && lines.back().empty()) lines.pop_back();
  return lines;
}

using Lines = std::vector<std::string>;

TEST(TerminalScreen, ModelsTheEscapesTheWriterUses) {
  EXPECT_EQ(Screen("a\nT1\nT2\n" + Erase(2) + "b\nT1\nT2\n"),
            (Lines{"a", "b", "T1", "T2"}));
}

class TerminalFooterTest : public ::testing::Test {
 protected:
  // stdout to its own pipe; the footer on stderr.
  TerminalFooterTest() : writer_(out_.write_fd(), err_.write_fd(), 1 << 20) {}
  ~TerminalFooterTest() override {
    EXPECT_TRUE(writer_.Drain(milliseconds(2000), milliseconds(5000)));
  }
  // Sets the footer and waits until it is on the "screen".
  void ShowFooter(const std::string& footer, const std::string& erase = "") {
    writer_.SetFooter(Stream::kErr, footer);
    const std::string want = erase + footer;
    ASSERT_EQ(ReadBytes(err_.read_fd(), want.size()), want);
  }

  Pipe out_, err_;
  TerminalWriter writer_;
};

TEST_F(TerminalFooterTest, DrawsTheFooterAsSoonAsItIsSet) {
  writer_.SetFooter(Stream::kErr, "T1\nT2\n");
  EXPECT_EQ(ReadBytes(err_.read_fd(), 6), "T1\nT2\n");
  EXPECT_EQ(ReadMore(err_.read_fd()), "");
}

TEST_F(TerminalFooterTest, ErasesTheFooterBeforeALineAndDrawsItAgainAfter) {
  ShowFooter("T1\nT2\n");
  writer_.Write(Stream::kErr, "line\n");
  const std::string want = Erase(2) + "line\n" + "T1\nT2\n";
  EXPECT_EQ(ReadBytes(err_.read_fd(), want.size()), want);
  EXPECT_EQ(ReadMore(err_.read_fd()), "");
  EXPECT_EQ(ReadMore(out_.read_fd(), 0), "");
}

TEST_F(TerminalFooterTest, KeepsTheFooterBelowEveryLine) {
  ShowFooter("T1\nT2\n");
  std::string got = "T1\nT2\n";
  for (int i = 0; i < 50; ++i)
    writer_.Write(Stream::kErr, "line " + std::to_string(i) + "\n");
  ASSERT_TRUE(writer_.Drain(milliseconds(2000), milliseconds(5000)));
  got += ReadMore(err_.read_fd());
  Lines want;
  for (int i = 0; i < 50; ++i) want.push_back("line " + std::to_string(i));
  want.push_back("T1");
  want.push_back("T2");
  EXPECT_EQ(Screen(got), want);
}

TEST_F(TerminalFooterTest, ReplacesTheFooterOnTheScreen) {
  ShowFooter("T1\nT2\n");
  ShowFooter("N\n", Erase(2));
  writer_.Write(Stream::kErr, "x\n");
  const std::string want = Erase(1) + "x\n" + "N\n";
  EXPECT_EQ(ReadBytes(err_.read_fd(), want.size()), want);
}

TEST_F(TerminalFooterTest, AnEmptyFooterErasesTheOldOneAndDrawsNothing) {
  ShowFooter("T1\nT2\n");
  ShowFooter("", Erase(2));
  writer_.Write(Stream::kErr, "x\n");
  EXPECT_EQ(ReadBytes(err_.read_fd(), 2), "x\n");
  EXPECT_EQ(ReadMore(err_.read_fd()), "");
}

TEST_F(TerminalFooterTest, LeavesTheReleasedFooterAndWritesBelowIt) {
  ShowFooter("T1\nT2\n");
  writer_.ReleaseFooter(Stream::kErr);
  writer_.Write(Stream::kErr, "after\n");
  EXPECT_EQ(ReadBytes(err_.read_fd(), 6), "after\n");
  writer_.Write(Stream::kErr, "more\n");
  EXPECT_EQ(ReadBytes(err_.read_fd(), 5), "more\n");
  EXPECT_EQ(ReadMore(err_.read_fd()), "");
}

TEST_F(TerminalFooterTest, DrawsAFooterReleasedBeforeItWasShown) {
  writer_.SetFooter(Stream::kErr, "F\n");
  writer_.ReleaseFooter(Stream::kErr);
  writer_.Write(Stream::kErr, "after\n");
  EXPECT_EQ(ReadBytes(err_.read_fd(), 8), "F\nafter\n");
  EXPECT_EQ(ReadMore(err_.read_fd()), "");
}

TEST_F(TerminalFooterTest, WritesALineQueuedBeforeTheReleaseAboveTheFooter) {
  ShowFooter("T\n");
  writer_.Write(Stream::kErr, "a\n");
  writer_.SetFooter(Stream::kErr, "F2\n");
  writer_.ReleaseFooter(Stream::kErr);
  writer_.Write(Stream::kErr, "b\n");
  ASSERT_TRUE(writer_.Drain(milliseconds(2000), milliseconds(5000)));
  const std::string got = ReadMore(err_.read_fd());
  EXPECT_EQ(Screen("T\n" + got), (Lines{"a", "F2", "b"})) << got;
  // Nothing is erased after the released footer.
  ASSERT_GE(got.size(), 5u);
  EXPECT_EQ(got.substr(got.size() - 5), "F2\nb\n");
}

TEST_F(TerminalFooterTest, ReleasingWithoutAFooterChangesNothing) {
  writer_.ReleaseFooter(Stream::kErr);
  writer_.Write(Stream::kErr, "x\n");
  EXPECT_EQ(ReadBytes(err_.read_fd(), 2), "x\n");
  EXPECT_EQ(ReadMore(err_.read_fd()), "");
}

TEST_F(TerminalFooterTest, AFooterCanBeSetAgainAfterARelease) {
  ShowFooter("T\n");
  writer_.ReleaseFooter(Stream::kErr);
  writer_.Write(Stream::kErr, "x\n");
  EXPECT_EQ(ReadBytes(err_.read_fd(), 2), "x\n");
  ShowFooter("U\n");  // a new footer: nothing of the released one erased
  writer_.Write(Stream::kErr, "y\n");
  const std::string want = Erase(1) + "y\n" + "U\n";
  EXPECT_EQ(ReadBytes(err_.read_fd(), want.size()), want);
}

TEST_F(TerminalFooterTest, LeavesAnotherFilesStreamAlone) {
  ShowFooter("T1\nT2\n");
  writer_.Write(Stream::kOut, "out line\n");
  EXPECT_EQ(ReadBytes(out_.read_fd(), 9), "out line\n");
  EXPECT_EQ(ReadMore(out_.read_fd()), "");
  EXPECT_EQ(ReadMore(err_.read_fd()), "");
}

TEST(TerminalFooter, RedrawsAroundTheOtherStreamWhenBothAreOneFile) {
  Pipe pipe;
  const int out_fd = ::dup(pipe.write_fd());  // one file, two descriptors
  {
    TerminalWriter writer(out_fd, pipe.write_fd(), 1 << 20);
    writer.SetFooter(Stream::kErr, "T1\nT2\n");
    ASSERT_EQ(ReadBytes(pipe.read_fd(), 6), "T1\nT2\n");
    writer.Write(Stream::kOut, "stdout line\n");
    const std::string want = Erase(2) + "stdout line\n" + "T1\nT2\n";
    EXPECT_EQ(ReadBytes(pipe.read_fd(), want.size()), want);
    writer.ReleaseFooter(Stream::kErr);
    writer.Write(Stream::kOut, "later\n");
    EXPECT_EQ(ReadBytes(pipe.read_fd(), 6), "later\n");
    EXPECT_TRUE(writer.Drain(milliseconds(2000), milliseconds(5000)));
  }
  EXPECT_EQ(ReadMore(pipe.read_fd()), "");
  ::close(out_fd);
}

}  // namespace
}  // namespace dslaunch::launcher
