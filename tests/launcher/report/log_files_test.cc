#include "launcher/report/log_files.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>

namespace dslaunch::launcher {
namespace {

namespace fs = std::filesystem;

constexpr uid_t kNobody = 65534;

std::string ReadFile(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

class SinkFileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/dsl-logfiles-XXXXXX";
    dir_ = ::mkdtemp(tmpl);
  }
  void TearDown() override { fs::remove_all(dir_); }
  static StatusOr<std::unique_ptr<SinkFile>> Create(const fs::path& path) {
    return SinkFile::Create(path.string(), [](const Status&) {});
  }
  fs::path dir_;
};

#define NEEDS_ROOT()    \
  if (::geteuid() != 0) \
  GTEST_SKIP() << "needs root to give a file to another user"

TEST_F(SinkFileTest, WritesANewFileAndTruncatesOneOfThisUser) {
  { std::ofstream(dir_ / "stacks-rank-1.txt") << "an earlier run's"; }
  auto file = Create(dir_ / "stacks-rank-1.txt");
  ASSERT_TRUE(file.ok()) << file.status().message();
  (*file)->Append("new");
  (*file)->Close();
  EXPECT_TRUE((*file)->status().ok());
  EXPECT_EQ(ReadFile(dir_ / "stacks-rank-1.txt"), "new");
  EXPECT_EQ((*file)->path(), (dir_ / "stacks-rank-1.txt").string());
}

// Planted in a shared --log_dir, world-writable, for its owner to read what
// the ranks print: neither emptied nor written.
TEST_F(SinkFileTest, RefusesAFileOfAnotherUserWithoutTruncatingIt) {
  NEEDS_ROOT();
  const fs::path planted = dir_ / "rank-0.log";
  { std::ofstream(planted) << "theirs"; }
  ASSERT_EQ(::chmod(planted.c_str(), 0666), 0);
  ASSERT_EQ(::chown(planted.c_str(), kNobody, kNobody), 0);
  auto file = Create(planted);
  ASSERT_FALSE(file.ok());
  EXPECT_EQ(file.status().code(), StatusCode::kIoError);
  EXPECT_EQ(file.status().message(),
            "cannot write " + planted.string() +
                ": the file belongs to another user (uid 65534)");
  EXPECT_EQ(ReadFile(planted), "theirs");
}

TEST_F(SinkFileTest, RefusesToWriteIntoADirectoryOfAnotherUser) {
  NEEDS_ROOT();
  const fs::path theirs = dir_ / "theirs";
  fs::create_directories(theirs);
  ASSERT_EQ(::chown(theirs.c_str(), kNobody, kNobody), 0);
  auto file = Create(theirs / "stacks-rank-0.txt");
  ASSERT_FALSE(file.ok());
  EXPECT_NE(file.status().message().find(theirs.string() +
                                         " belongs to another user"),
            std::string::npos)
      << file.status().message();
  EXPECT_TRUE(fs::is_empty(theirs));
}

// A FIFO planted as the file itself (not through a link) is opened without
// blocking too: the old open waited for a reader forever. Run in a child so
// that the old behaviour fails the test instead of hanging it.
TEST_F(SinkFileTest, APipePlantedAsTheFileFailsAtOnceInsteadOfBlocking) {
  ASSERT_EQ(::mkfifo((dir_ / "rank-0.log").c_str(), 0600), 0);
  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    auto file = Create(dir_ / "rank-0.log");
    const bool said =
        !file.ok() && file.status().message().find(
                          "a pipe that nobody reads") != std::string::npos;
    ::_exit(said ? 0 : 1);
  }
  int status = 0;
  const auto deadline =
      std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (::waitpid(pid, &status, WNOHANG) == 0) {
    if (std::chrono::steady_clock::now() > deadline) {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, &status, 0);
      FAIL() << "SinkFile::Create blocked on a FIFO nobody reads";
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0);
}

TEST_F(SinkFileTest, RefusesAHardLinkToAnotherFile) {
  const fs::path precious = dir_ / "precious";
  { std::ofstream(precious) << "keep"; }
  fs::create_hard_link(precious, dir_ / "rank-0.log");
  auto file = Create(dir_ / "rank-0.log");
  ASSERT_FALSE(file.ok());
  EXPECT_NE(file.status().message().find("hard links"), std::string::npos)
      << file.status().message();
  EXPECT_EQ(ReadFile(precious), "keep");
}

TEST(OpenLogDir, NamesTheFlagAndRefusesAnotherUsersDirectory) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root to give a directory away";
  char tmpl[] = "/tmp/dsl-logdir-XXXXXX";
  const fs::path dir = ::mkdtemp(tmpl);
  ASSERT_EQ(::chown(dir.c_str(), kNobody, kNobody), 0);
  auto opened = OpenLogDir(dir.string(), "--enable_each_rank_log");
  fs::remove_all(dir);
  ASSERT_FALSE(opened.ok());
  EXPECT_EQ(opened.status().message().find("--enable_each_rank_log " +
                                           dir.string() + ": "),
            0u)
      << opened.status().message();
}

}  // namespace
}  // namespace dslaunch::launcher
