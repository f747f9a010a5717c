// Run directories: each names its agent; a new agent of the job removes
// those whose agent is gone, and nothing else.
#include "agent/run_dirs.h"

#include <gtest/gtest.h>
#include <stdlib.h>  // mkdtemp
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "base/process_tree.h"

namespace dslaunch::agent {
namespace {

namespace fs = std::filesystem;

class RunDirs : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string d = ::testing::TempDir() + "dsl_rundirs_XXXXXX";
    ASSERT_NE(::mkdtemp(d.data()), nullptr);
    dir_ = d;
  }
  void TearDown() override { fs::remove_all(dir_); }
  // A run directory of the job as an agent `pid` started at `ticks` left.
  std::string Left(const std::string& job, long long pid,
                   unsigned long long ticks, const std::string& suffix) {
    const std::string p = dir_ + "/dsl-" + job.substr(0, 8) + "-" + suffix;
    fs::create_directory(p);
    std::ofstream(p + "/agent") << pid << " " << ticks << "\n";
    std::ofstream(p + "/store.sock") << "";
    return p;
  }
  std::string dir_;
};

TEST_F(RunDirs, NamesItsAgent) {
  auto made = MakeRunDir(dir_, "0123456789abcdef");
  ASSERT_TRUE(made.ok()) << made.status().message();
  EXPECT_EQ(fs::path(*made).filename().string().rfind("dsl-01234567-", 0), 0u);
  std::ifstream in(*made + "/agent");
  long long pid = 0;
  unsigned long long ticks = 0;
  in >> pid >> ticks;
  EXPECT_EQ(pid, ::getpid());
  EXPECT_EQ(ticks, base::ProcessStartTicks(::getpid()));
  // Ours, alive: kept.
  EXPECT_EQ(RemoveDeadAgentsRunDirs(dir_, "0123456789abcdef"), 0);
  EXPECT_TRUE(fs::exists(*made));
}

TEST_F(RunDirs, RemovesOnlyTheJobsDirectoriesWhoseAgentIsGone) {
  const std::string job = "0123456789abcdef";
  // A process that lived and is gone.
  const pid_t child = ::fork();
  if (child == 0) ::_exit(0);
  ASSERT_GT(child, 0);
  const unsigned long long child_ticks = base::ProcessStartTicks(child);
  int status = 0;
  ::waitpid(child, &status, 0);
  const std::string gone = Left(job, child, child_ticks, "aaaaaa");
  // The pid runs, but it is not the process that made it (reused).
  const std::string reused = Left(
      job, ::getppid(), base::ProcessStartTicks(::getppid()) + 5, "bbbbbb");
  // A live agent's (our parent stands for one).
  const std::string live =
      Left(job, ::getppid(), base::ProcessStartTicks(::getppid()), "cccccc");
  // Another job's, gone: not this job's to clean.
  const std::string other = Left("fedcba9876543210", child, 1, "dddddd");
  // Not a run directory: no agent file, a bad one, a link, a file.
  fs::create_directory(dir_ + "/dsl-01234567-eeeeee");
  const std::string bad = Left(job, 0, 0, "ffffff");
  fs::create_directory_symlink(gone, dir_ + "/dsl-01234567-gggggg");
  std::ofstream(dir_ + "/dsl-01234567-hhhhhh") << "1 1\n";
  EXPECT_EQ(RemoveDeadAgentsRunDirs(dir_, job), 2);
  EXPECT_FALSE(fs::exists(gone));
  EXPECT_FALSE(fs::exists(reused));
  EXPECT_TRUE(fs::exists(live));
  EXPECT_TRUE(fs::exists(other));
  EXPECT_TRUE(fs::exists(dir_ + "/dsl-01234567-eeeeee"));
  EXPECT_TRUE(fs::exists(bad));
  EXPECT_TRUE(fs::is_symlink(dir_ + "/dsl-01234567-gggggg"));
  EXPECT_TRUE(fs::exists(dir_ + "/dsl-01234567-hhhhhh"));
  EXPECT_EQ(RemoveDeadAgentsRunDirs(dir_ + "/missing", job), 0);
}

}  // namespace
}  // namespace dslaunch::agent
