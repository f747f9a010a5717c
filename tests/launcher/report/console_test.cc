#include "launcher/report/console.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>

#include "proto/progress.h"
#include "tests/common/temp_fd.h"

namespace dslaunch::launcher {
namespace {

using dslaunch::testing::ReadFd;
using dslaunch::testing::TempFd;

namespace fs = std::filesystem;
using std::chrono::milliseconds;

std::string ReadFile(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

Plan TwoNodePlan() {
  Plan plan;
  plan.nodes.push_back(NodePlan{0, "node-a", {0, 1}, 0, {}, {}});
  plan.nodes.push_back(NodePlan{1, "node-b", {0}, 2, {}, {}});
  plan.world_size = 3;
  return plan;
}

class ConsoleTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("dsl-console-" + std::to_string(::getpid()) + "-" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    out_ = TempFd();
    err_ = TempFd();
  }
  void TearDown() override {
    console_.reset();
    fs::remove_all(dir_);
    ::close(out_);
    ::close(err_);
  }
  Console& Make(Console::Options options = {}) {
    options.drain_stall = milliseconds(500);
    console_ = std::make_unique<Console>(out_, err_, options);
    return *console_;
  }
  std::string Out() {
    console_->DrainTerminal();
    return ReadFd(out_);
  }
  std::string Err() {
    console_->DrainTerminal();
    return ReadFd(err_);
  }
  std::string Log(int rank) {
    return ReadFile(dir_ / ("rank-" + std::to_string(rank) + ".log"));
  }

  fs::path dir_;
  int out_ = -1, err_ = -1;
  std::unique_ptr<Console> console_;
};

TEST_F(ConsoleTest, PrefixesEachLineWithHostAndRankOnItsStream) {
  Console& c = Make();
  ASSERT_TRUE(c.Open(TwoNodePlan(), "").ok());
  c.Line(0, false, "hello", false);
  c.Line(2, true, "oops", false);
  c.Note("a note");
  EXPECT_EQ(Out(), "[node-a:0] hello\n");
  EXPECT_EQ(Err(), "[node-b:2] oops\ndslaunch: a note\n");
}

TEST_F(ConsoleTest, KeepsTheLastLinesOfEachRank) {
  Console& c = Make();
  ASSERT_TRUE(c.Open(TwoNodePlan(), "").ok());
  for (int i = 0; i < 25; ++i) c.Line(1, i % 2, "l" + std::to_string(i), false);
  c.Line(2, false, "other", false);
  const auto& last = c.LastLines(1);
  ASSERT_EQ(last.size(), Console::kKeptLines);
  EXPECT_EQ(last.front(), "l15");
  EXPECT_EQ(last.back(), "l24");
  EXPECT_EQ(c.LastLines(2).size(), 1u);
}

TEST_F(ConsoleTest, WritesEachRanksLinesToItsLogFile) {
  Console& c = Make();
  ASSERT_TRUE(c.Open(TwoNodePlan(), dir_.string()).ok());
  c.Line(0, false, "out 1", false);
  c.Line(0, true, "err 1", false);
  c.Line(1, false, "", false);
  c.Close();
  EXPECT_EQ(Log(0), "out 1\nerr 1\n");
  EXPECT_EQ(Log(1), "\n");
  EXPECT_EQ(Log(2), "");
}

TEST_F(ConsoleTest, RefusesALogThatIsASymlinkToSomebodysFile) {
  fs::create_directories(dir_);
  const fs::path victim = dir_ / "victim";
  { std::ofstream(victim) << "precious\n"; }
  fs::create_symlink(victim, dir_ / "rank-0.log");
  Console& c = Make();
  const Status st = c.Open(TwoNodePlan(), dir_.string());
  EXPECT_FALSE(st.ok());
  EXPECT_NE(st.message().find("symbolic link"), std::string::npos)
      << st.message();
  EXPECT_EQ(ReadFile(victim), "precious\n");
}

TEST_F(ConsoleTest, RefusesALogLinkedToAPipeNobodyReadsWithoutBlocking) {
  // Opening a FIFO to write blocks until a reader comes: the launcher would
  // hang there (on its event loop, for stacks files mid-job).
  fs::create_directories(dir_);
  const fs::path fifo = dir_ / "fifo";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  fs::create_symlink(fifo, dir_ / "rank-0.log");
  Console& c = Make();
  const Status st = c.Open(TwoNodePlan(), dir_.string());
  EXPECT_FALSE(st.ok());
  EXPECT_NE(st.message().find("a pipe that nobody reads"), std::string::npos)
      << st.message();
}

TEST_F(ConsoleTest, WritesALogLinkedToAPipeOrADevice) {
  fs::create_directories(dir_);
  const fs::path fifo = dir_ / "fifo";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  const int reader = ::open(fifo.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  ASSERT_GE(reader, 0);
  fs::create_symlink(fifo, dir_ / "rank-0.log");
  fs::create_symlink("/dev/null", dir_ / "rank-1.log");
  Console& c = Make();
  ASSERT_TRUE(c.Open(TwoNodePlan(), dir_.string()).ok());
  c.Line(0, false, "to the pipe", false);
  c.Line(1, false, "to nowhere", false);
  c.Close();
  char buf[64] = {};
  const ssize_t n = ::read(reader, buf, sizeof(buf) - 1);
  ::close(reader);
  EXPECT_EQ(std::string(buf, n > 0 ? static_cast<size_t>(n) : 0),
            "to the pipe\n");
  EXPECT_TRUE(fs::is_fifo(fifo));
}

TEST_F(ConsoleTest, JoinsPiecesOfALongLineWithoutTearingTheOtherStream) {
  Console& c = Make();
  ASSERT_TRUE(c.Open(TwoNodePlan(), dir_.string()).ok());
  c.Line(0, false, "aaaa", true);  // a piece: more of the line follows
  c.Line(0, true, "err line", false);
  c.Line(0, false, "bbbb", true);
  c.Line(0, false, "cc", false);  // the end of the stdout line
  c.Close();
  EXPECT_EQ(Log(0), "err line\naaaabbbbcc\n");
  // The terminal shows the pieces as they came, each with its prefix.
  EXPECT_EQ(Out(), "[node-a:0] aaaa\n[node-a:0] bbbb\n[node-a:0] cc\n");
}

TEST_F(ConsoleTest, SpillsALongLineToDiskAndStillWritesItWhole) {
  Console::Options options;
  options.line_memory = 1000;  // pieces beyond this go to an unlinked file
  Console& c = Make(options);
  ASSERT_TRUE(c.Open(TwoNodePlan(), dir_.string()).ok());
  std::string want;
  for (int i = 0; i < 10; ++i) {
    const std::string piece(700, static_cast<char>('a' + i));
    want += piece;
    c.Line(0, false, piece, true);
    c.Line(0, true, "e" + std::to_string(i), false);
  }
  c.Line(0, false, "end", false);
  c.Close();
  EXPECT_EQ(Log(0),
            "e0\ne1\ne2\ne3\ne4\ne5\ne6\ne7\ne8\ne9\n" + want + "end\n");
  // Nothing is left behind in the log directory.
  int files = 0;
  for ([[maybe_unused]] const auto& e : fs::directory_iterator(dir_)) ++files;
  EXPECT_EQ(files, 4);  // three rank logs and metrics.jsonl
}

TEST_F(ConsoleTest, WritesAnUnterminatedLastLineWholeWhenTheRankEnds) {
  Console& c = Make();
  ASSERT_TRUE(c.Open(TwoNodePlan(), dir_.string()).ok());
  c.Line(0, false, "line", false);
  c.Line(0, false, "no newline", true);
  c.Line(0, true, "err no newline", true);
  c.EndOfOutput(0);
  c.Flush();
  EXPECT_EQ(Log(0), "line\nno newline\nerr no newline");
  c.Close();
  EXPECT_EQ(Log(0), "line\nno newline\nerr no newline");
}

TEST_F(ConsoleTest, CreatesLogsWithoutAccessForOthers) {
  const mode_t old = ::umask(022);
  Console& c = Make();
  const fs::path nested = dir_ / "a" / "b";
  Status st = c.Open(TwoNodePlan(), nested.string());
  ::umask(old);
  ASSERT_TRUE(st.ok()) << st.message();
  struct stat s;
  ASSERT_EQ(::stat((nested / "rank-0.log").c_str(), &s), 0);
  EXPECT_EQ(s.st_mode & 0777, 0600u);
  ASSERT_EQ(::stat((nested / "metrics.jsonl").c_str(), &s), 0);
  EXPECT_EQ(s.st_mode & 0777, 0600u);
  ASSERT_EQ(::stat(nested.c_str(), &s), 0);
  EXPECT_EQ(s.st_mode & 0777, 0700u);
  ASSERT_EQ(::stat((dir_ / "a").c_str(), &s), 0);
  EXPECT_EQ(s.st_mode & 0777, 0700u);
}

TEST_F(ConsoleTest, TightensALogFileLeftWorldReadableByAnEarlierRun) {
  fs::create_directories(dir_);
  { std::ofstream(dir_ / "rank-0.log") << "old"; }
  ::chmod((dir_ / "rank-0.log").c_str(), 0644);
  Console& c = Make();
  ASSERT_TRUE(c.Open(TwoNodePlan(), dir_.string()).ok());
  struct stat s;
  ASSERT_EQ(::stat((dir_ / "rank-0.log").c_str(), &s), 0);
  EXPECT_EQ(s.st_mode & 0777, 0600u);
}

// The modes themselves: FileModes in tests/base/safe_files_test.cc.

TEST_F(ConsoleTest, AnnotatesProgressInMetricsAndShowsRankZeros) {
  Console& c = Make();
  ASSERT_TRUE(c.Open(TwoNodePlan(), dir_.string()).ok());
  c.Progress(0, R"({"step": 3, "loss": 2.5})", 12.5);
  c.Progress(2, R"({"step": 4})", 13.0);
  c.Close();
  std::istringstream metrics(ReadFile(dir_ / "metrics.jsonl"));
  std::string line;
  ASSERT_TRUE(std::getline(metrics, line));
  EXPECT_EQ(line,
            R"({"step":3,"loss":2.5,"rank":0,"node":"node-a","time":12.5})");
  ASSERT_TRUE(std::getline(metrics, line));
  EXPECT_EQ(line, R"({"step":4,"rank":2,"node":"node-b","time":13.0})");
  EXPECT_FALSE(std::getline(metrics, line));
  EXPECT_EQ(Err(), "[node-a:0 progress] step 3  loss 2.5\n");
  EXPECT_EQ(c.progress_records(), 2);
}

TEST_F(ConsoleTest, DropsDeeplyNestedProgressAsMalformedWithoutCrashing) {
  Console& c = Make();
  ASSERT_TRUE(c.Open(TwoNodePlan(), dir_.string()).ok());
  const std::string arrays =
      "{\"a\":" + std::string(100000, '[') + std::string(100000, ']') + "}";
  std::string objects = "{\"x\":1";
  for (int i = 0; i < 20000; ++i) objects += ",\"a\":{";  // unbalanced too
  c.Progress(0, arrays, 1.0);
  c.Progress(0, objects, 1.0);
  c.Progress(0, R"({"ok": [[[1]]]})", 1.0);
  c.Close();
  EXPECT_EQ(c.malformed_progress(), 2);
  EXPECT_EQ(ReadFile(dir_ / "metrics.jsonl"),
            R"({"ok":[[[1]]],"rank":0,"node":"node-a","time":1.0})"
            "\n");
  EXPECT_EQ(Err(), "[node-a:0 progress] ok [[[1]]]\n");
}

TEST_F(ConsoleTest, EscapesControlCharactersInProgressFields) {
  Console& c = Make();
  ASSERT_TRUE(c.Open(TwoNodePlan(), "").ok());
  // ESC [2J (clear screen) in a value, a bell in a key, C1 CSI, DEL, and a
  // nested string; tab and non-ASCII text stay as they are.
  c.Progress(0,
             "{\"msg\": \"\\u001b[2Jhi\\tthere\", \"b\\u0007\": \"\\u009b31m\","
             " \"del\": \"\\u007f\", \"n\": {\"s\": \"\\u0085\"}, \"u\": "
             "\"\xc3\xa9\"}",
             1.0);
  const std::string err = Err();
  EXPECT_EQ(err.find('\x1b'), std::string::npos);
  EXPECT_EQ(err.find('\x07'), std::string::npos);
  EXPECT_EQ(err.find("\xc2\x9b"), std::string::npos);
  EXPECT_EQ(err.find("\xc2\x85"), std::string::npos);
  EXPECT_EQ(err.find('\x7f'), std::string::npos);
  EXPECT_EQ(err,
            "[node-a:0 progress] msg \\u001b[2Jhi\tthere  b\\u0007 \\u009b31m"
            "  del \\u007f  n {\"s\":\"\\u0085\"}  u \xc3\xa9\n");
}

TEST_F(ConsoleTest, LeavesRankOutputLinesAsWritten) {
  Console& c = Make();
  ASSERT_TRUE(c.Open(TwoNodePlan(), "").ok());
  c.Line(0, false, "\x1b[31mred\x1b[0m", false);
  EXPECT_EQ(Out(), "[node-a:0] \x1b[31mred\x1b[0m\n");
}

TEST_F(ConsoleTest, BoundsRankZerosProgressLine) {
  Console& c = Make();
  ASSERT_TRUE(c.Open(TwoNodePlan(), "").ok());
  nlohmann::json record;
  for (int i = 0; i < 50; ++i)
    record["k" + std::to_string(i)] = std::string(1000, 'v');
  c.Progress(0, record.dump(), 1.0);
  const std::string err = Err();
  EXPECT_LT(err.size(), Console::kMaxProgressLineBytes +
                            2 * Console::kMaxProgressFieldBytes + 64);
  EXPECT_NE(err.find("v...  k"), std::string::npos) << err;  // clipped field
  EXPECT_EQ(err.substr(err.size() - 6), "  ...\n");          // clipped line
}

TEST_F(ConsoleTest, CountsDroppedLinesAndSaysSoWhenTheTerminalIsStuck) {
  int pipe_fds[2];
  ASSERT_EQ(::pipe(pipe_fds), 0);
  ::close(out_);
  out_ = pipe_fds[1];  // stdout: a pipe nobody reads
  Console::Options options;
  options.terminal_limit = 64 << 10;
  Console& c = Make(options);
  ASSERT_TRUE(c.Open(TwoNodePlan(), dir_.string()).ok());
  const std::string line(1000, 'z');
  for (int i = 0; i < 5000; ++i) c.Line(i % 3, false, line, false);
  c.Close();
  // The log files are complete regardless.
  std::string want;
  for (int i = 0; i < 5000; i += 3) want += line + "\n";
  EXPECT_EQ(Log(0), want);
  c.DrainTerminal();
  EXPECT_GT(c.dropped_lines(), 4800);
  // One note per stall (the pipe's own buffer may end the first early);
  // together they count every dropped line.
  std::istringstream err(ReadFd(err_));
  std::string line_read;
  int64_t noted = 0;
  const std::string tail =
      " stdout, 0 stderr: the terminal did not keep up); "
      "rank logs in " +
      dir_.string() + " are complete";
  while (std::getline(err, line_read)) {
    long long n = 0, out = 0;
    ASSERT_EQ(
        std::sscanf(line_read.c_str(),
                    "dslaunch: %lld console lines dropped (%lld", &n, &out),
        2)
        << line_read;
    EXPECT_EQ(n, out);
    EXPECT_EQ(line_read.substr(line_read.size() - tail.size()), tail);
    noted += n;
  }
  EXPECT_EQ(noted, c.dropped_lines());
  ::close(pipe_fds[0]);
}

TEST_F(ConsoleTest, ReportsAFailedLogWriteOncePerFileAndKeepsGoing) {
  // Rank 1's log and metrics.jsonl on a device that is always full.
  fs::create_directories(dir_);
  const fs::path log1 = dir_ / "rank-1.log";
  fs::create_symlink("/dev/full", log1);
  fs::create_symlink("/dev/full", dir_ / "metrics.jsonl");
  Console& c2 = Make();
  ASSERT_TRUE(c2.Open(TwoNodePlan(), dir_.string()).ok());
  EXPECT_TRUE(c2.sink_status().ok());
  const std::string big(100000, 'q');  // past the file buffer: written now
  c2.Line(1, false, big, false);
  c2.Line(1, false, big, false);
  c2.Line(0, false, "fine", false);
  c2.Progress(0, R"({"step": 1})", 1.0);
  c2.Close();
  ASSERT_FALSE(c2.sink_status().ok());
  EXPECT_NE(c2.sink_status().message().find(log1.string()), std::string::npos);
  EXPECT_NE(c2.sink_status().message().find("No space left on device"),
            std::string::npos);
  const std::string err = Err();
  const std::string rank1 =
      "dslaunch: cannot write " + log1.string() +
      ": No space left on device (the file is incomplete; the job goes on)\n";
  EXPECT_EQ(err.find(rank1), 0u) << err;
  EXPECT_EQ(err.find(rank1, 1), std::string::npos) << "reported twice";
  EXPECT_NE(err.find("metrics.jsonl"), std::string::npos) << err;
  // The console still showed everything and the other logs are whole.
  EXPECT_EQ(Out().size(), 2 * (big.size() + 12) + 16);
  EXPECT_EQ(Log(0), "fine\n");
}

TEST_F(ConsoleTest, OpenRefusesALogDirOfAnotherUserNamingIt) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root to give a directory away";
  fs::create_directories(dir_);
  ASSERT_EQ(::chown(dir_.c_str(), 65534, 65534), 0);
  Console& c = Make();
  const Status st = c.Open(TwoNodePlan(), dir_.string());
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.code(), StatusCode::kIoError);  // exit 74
  EXPECT_EQ(st.message(), "--log_dir " + dir_.string() + ": " + dir_.string() +
                              " belongs to another user (uid 65534); nothing "
                              "is written there");
  EXPECT_TRUE(fs::is_empty(dir_));
}

TEST_F(ConsoleTest, OpenFailsWhenTheLogDirIsAFile) {
  fs::create_directories(dir_);
  { std::ofstream(dir_ / "file") << "x"; }
  Console& c = Make();
  Status st = c.Open(TwoNodePlan(), (dir_ / "file").string());
  EXPECT_FALSE(st.ok());
  EXPECT_NE(st.message().find("--log_dir"), std::string::npos);
}

}  // namespace
}  // namespace dslaunch::launcher
