#include "agent/stack_collector.h"

#include <gtest/gtest.h>
#include <signal.h>    // kill
#include <spawn.h>     // posix_spawn
#include <stdlib.h>    // mkdtemp
#include <sys/stat.h>  // chmod, mkdir
#include <sys/wait.h>  // waitpid
#include <unistd.h>    // chown, symlink, geteuid

#include <boost/asio/io_context.hpp>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "base/process_set.h"  // ResolveProgram
#include "tests/common/child_process.h"
#include "tests/common/run_until.h"

extern char** environ;

namespace dslaunch::agent {
namespace {

namespace asio = boost::asio;
using dslaunch::testing::RunUntil;
using std::chrono::milliseconds;

using Child = dslaunch::testing::ChildProcess;

bool Alive(pid_t pid) { return ::kill(pid, 0) == 0; }

class StackCollectorTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/dsl-stacks-test-XXXXXX";
    dir_ = ::mkdtemp(tmpl);
  }
  void TearDown() override {
    collector_.reset();
    io_.restart();
    io_.poll();
    std::filesystem::remove_all(dir_);
  }
  // A fake stack tool named `name` in this test's own PATH.
  void FakeTool(const std::string& name, const std::string& script) {
    const std::string path = dir_ + "/" + name;
    std::ofstream(path) << "#!/bin/sh\n" << script << "\n";
    ASSERT_EQ(::chmod(path.c_str(), 0755), 0);
  }
  void Make(StackToolOptions options) {
    collector_ = std::make_unique<StackCollector>(
        io_, [this](const wire::Stacks& s) { replies_.push_back(s); }, options);
  }
  StackToolOptions Fakes() {
    StackToolOptions o;
    o.path_env = dir_;
    return o;
  }
  bool WaitReplies(size_t n, milliseconds timeout = milliseconds(10000)) {
    return RunUntil(
        io_, [&] { return replies_.size() >= n; }, timeout);
  }

  asio::io_context io_;
  std::string dir_;
  std::unique_ptr<StackCollector> collector_;
  std::vector<wire::Stacks> replies_;
};

TEST_F(StackCollectorTest, RealToolShowsTheFramesOfASleepingProcess) {
  const bool have = base::ResolveProgram("eu-stack", "/usr/bin:/bin").ok() ||
                    base::ResolveProgram("gdb", "/usr/bin:/bin").ok();
  if (!have) GTEST_SKIP() << "neither eu-stack (elfutils) nor gdb installed";
  Child sleeper({"sleep", "60"});
  ASSERT_GT(sleeper.pid(), 0);
  Make({});
  ::usleep(100 * 1000);  // let it reach its sleep
  collector_->Collect(7, sleeper.pid());
  ASSERT_TRUE(WaitReplies(1, milliseconds(30000)));
  const wire::Stacks& s = replies_[0];
  EXPECT_EQ(s.rank(), 7);
  EXPECT_EQ(s.error(), "");
  EXPECT_TRUE(s.tool() == "eu-stack" || s.tool() == "gdb") << s.tool();
  EXPECT_NE(s.text().find("nanosleep"), std::string::npos) << s.text();
  EXPECT_TRUE(Alive(sleeper.pid()));  // traced, then let go
}

TEST_F(StackCollectorTest, NoToolIsSaidSo) {
  Make(Fakes());  // an empty PATH
  Child sleeper({"sleep", "60"});
  collector_->Collect(3, sleeper.pid());
  ASSERT_EQ(replies_.size(), 1u);  // at once
  EXPECT_EQ(replies_[0].rank(), 3);
  EXPECT_EQ(replies_[0].error(),
            "no stack tool found (install elfutils or gdb)");
}

TEST_F(StackCollectorTest, AStuckToolIsKilledAtTheRanksDeadline) {
  // The rank's time is spent: the fallback is not started after it.
  FakeTool("eu-stack", "echo $$ > " + dir_ + "/tool.pid; exec sleep 60");
  FakeTool("gdb", "touch " + dir_ + "/gdb.ran");
  StackToolOptions o = Fakes();
  o.timeout = milliseconds(300);
  Make(o);
  Child sleeper({"sleep", "60"});
  const auto t0 = std::chrono::steady_clock::now();
  collector_->Collect(1, sleeper.pid());
  ASSERT_TRUE(WaitReplies(1));
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(5));
  EXPECT_EQ(replies_[0].error(),
            "eu-stack: stopped: the 0.3 s for this rank's stacks ran out; "
            "no time left for gdb (other ranks' stacks or earlier tools took "
            "it)");
  pid_t tool = 0;
  std::ifstream(dir_ + "/tool.pid") >> tool;
  ASSERT_GT(tool, 0);
  EXPECT_FALSE(Alive(tool));
  EXPECT_TRUE(Alive(sleeper.pid()));
  EXPECT_FALSE(std::filesystem::exists(dir_ + "/gdb.ran"));
}

TEST_F(StackCollectorTest, AQueuedRankThatExitsIsAnsweredAtOnce) {
  FakeTool("eu-stack", "exec sleep 60");
  StackToolOptions o = Fakes();
  o.max_running = 1;
  Make(o);
  Child first({"sleep", "60"}), second({"sleep", "60"});
  collector_->Collect(1, first.pid());
  collector_->Collect(2, second.pid());
  ASSERT_EQ(collector_->queued(), 1u);
  collector_->Exited(2);
  ASSERT_EQ(replies_.size(), 1u);  // at once, not after rank 1's tool
  EXPECT_EQ(replies_[0].rank(), 2);
  EXPECT_EQ(replies_[0].error(),
            "the rank exited before its stacks were taken");
  EXPECT_EQ(collector_->queued(), 0u);
  EXPECT_EQ(collector_->running(), 1u);  // rank 1's goes on
  collector_->Exited(9);                 // never asked for: nothing
  EXPECT_EQ(replies_.size(), 1u);
}

TEST_F(StackCollectorTest, ARunningRankThatExitsGetsNoFurtherTool) {
  // Its pid may belong to another process by now: no gdb on it.
  FakeTool("eu-stack", "sleep 0.3; echo 'no such process' >&2; exit 1");
  FakeTool("gdb", "touch " + dir_ + "/gdb.ran");
  Make(Fakes());
  Child sleeper({"sleep", "60"});
  collector_->Collect(4, sleeper.pid());
  ASSERT_EQ(collector_->running(), 1u);
  collector_->Exited(4);
  ASSERT_TRUE(WaitReplies(1));
  EXPECT_EQ(replies_[0].rank(), 4);
  EXPECT_EQ(replies_[0].error(),
            "eu-stack: exit status 1 (no such process); the rank exited");
  EXPECT_FALSE(std::filesystem::exists(dir_ + "/gdb.ran"));
}

TEST_F(StackCollectorTest, FallsBackToGdbWhenEuStackFails) {
  FakeTool("eu-stack",
           "echo 'eu-stack: dwfl_linux_proc_attach: Operation "
           "not permitted' >&2; exit 1");
  FakeTool("gdb", "echo \"pid $2\"; echo '#0  0x00007f in main ()'");
  Make(Fakes());
  Child sleeper({"sleep", "60"});
  collector_->Collect(2, sleeper.pid());
  ASSERT_TRUE(WaitReplies(1));
  EXPECT_EQ(replies_[0].tool(), "gdb");
  EXPECT_EQ(replies_[0].error(), "");
  EXPECT_EQ(replies_[0].text(), "pid " + std::to_string(sleeper.pid()) +
                                    "\n#0  0x00007f in main ()\n");
}

TEST_F(StackCollectorTest, EveryToolFailingIsReportedWithItsWords) {
  FakeTool("eu-stack", "echo 'cannot attach' >&2; exit 1");
  FakeTool("gdb", "exit 0");
  Make(Fakes());
  Child sleeper({"sleep", "60"});
  collector_->Collect(2, sleeper.pid());
  ASSERT_TRUE(WaitReplies(1));
  EXPECT_EQ(replies_[0].error(),
            "eu-stack: exit status 1 (cannot attach); gdb: no output");
  EXPECT_EQ(replies_[0].text(), "");
}

TEST_F(StackCollectorTest, OutputIsBoundedWithAMarker) {
  FakeTool("eu-stack",
           "i=0; while [ $i -lt 4000 ]; do "
           "echo '#1  0x0000000000401234 in some_rather_long_function_name "
           "(argument=0x7ffd) at file.c:123'; i=$((i+1)); done");
  StackToolOptions o = Fakes();
  o.max_text_bytes = 64 * 1024;
  Make(o);
  Child sleeper({"sleep", "60"});
  collector_->Collect(5, sleeper.pid());
  ASSERT_TRUE(WaitReplies(1));
  const std::string& text = replies_[0].text();
  EXPECT_LE(text.size(), 64u * 1024);
  EXPECT_GT(text.size(), 60u * 1024);
  EXPECT_NE(text.find("[stack output over 64 KiB: "), std::string::npos);
  EXPECT_EQ(text.back(), '\n');
}

TEST_F(StackCollectorTest, BoundsConcurrencyAndMergesRepeatedRanks) {
  FakeTool("eu-stack", "sleep 0.2; echo \"stack of $2\"");
  StackToolOptions o = Fakes();
  o.max_running = 1;
  Make(o);
  Child a({"sleep", "60"}), b({"sleep", "60"});
  collector_->Collect(1, a.pid());
  collector_->Collect(2, b.pid());
  collector_->Collect(1, a.pid());  // merged with the first
  EXPECT_EQ(collector_->running(), 1u);
  EXPECT_EQ(collector_->queued(), 1u);
  ASSERT_TRUE(WaitReplies(2));
  RunUntil(
      io_, [] { return false; }, milliseconds(300));
  ASSERT_EQ(replies_.size(), 2u);
  EXPECT_EQ(replies_[0].rank(), 1);
  EXPECT_EQ(replies_[0].text(), "stack of " + std::to_string(a.pid()) + "\n");
  EXPECT_EQ(replies_[1].rank(), 2);
}

TEST_F(StackCollectorTest, UsesPySpyForAPythonInterpreter) {
  FakeTool("py-spy", "echo \"py-spy $*\"");
  FakeTool("eu-stack", "echo eu-stack");
  const auto python = base::ResolveProgram("python3", ::getenv("PATH"));
  if (!python.ok()) GTEST_SKIP() << "no python3";
  Child py({*python, "-c", "import time; time.sleep(60)"});
  Child sleeper({"sleep", "60"});
  // A pyenv shim is a shell script that execs the real interpreter: wait
  // (bounded) until it has.
  for (int i = 0; i < 250 && !IsPythonProcess(py.pid()); ++i)
    ::usleep(20 * 1000);
  EXPECT_TRUE(IsPythonProcess(py.pid()));
  EXPECT_FALSE(IsPythonProcess(sleeper.pid()));
  Make(Fakes());
  collector_->Collect(0, py.pid());
  ASSERT_TRUE(WaitReplies(1));
  EXPECT_EQ(replies_[0].tool(), "py-spy");
  EXPECT_EQ(replies_[0].text(),
            "py-spy dump --pid " + std::to_string(py.pid()) + "\n");
}

// A tool a rank could replace (another user's, writable by others, in a
// directory others may write) would run with the helper's right to trace
// every rank: it is passed over for the next trusted one on PATH.
TEST_F(StackCollectorTest, TakesOnlyToolsNobodyButRootCanReplace) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root to make root's files";
  const std::string trusted = dir_ + "/trusted";
  const std::string planted = dir_ + "/planted";
  ASSERT_EQ(::mkdir(trusted.c_str(), 0755), 0);
  ASSERT_EQ(::mkdir(planted.c_str(), 0777), 0);  // a venv's bin, say
  ASSERT_EQ(::chmod(planted.c_str(), 0777), 0);
  for (const std::string& d : {trusted, planted}) {
    std::ofstream(d + "/eu-stack") << "#!/bin/sh\n";
    ASSERT_EQ(::chmod((d + "/eu-stack").c_str(), 0755), 0);
  }
  auto tools = StackToolsFor(1234, false, planted + ":" + trusted);
  ASSERT_FALSE(tools.empty());
  EXPECT_EQ(tools[0].argv[0], trusted + "/eu-stack");
  EXPECT_FALSE(TrustedTool(planted + "/eu-stack").ok());
  EXPECT_TRUE(TrustedTool(trusted + "/eu-stack").ok());
  // Writable by its group; another user's; through a link: the target.
  ASSERT_EQ(::chmod((trusted + "/eu-stack").c_str(), 0775), 0);
  EXPECT_FALSE(TrustedTool(trusted + "/eu-stack").ok());
  ASSERT_EQ(::chmod((trusted + "/eu-stack").c_str(), 0755), 0);
  ASSERT_EQ(::chown((trusted + "/eu-stack").c_str(), 65534, 65534), 0);
  EXPECT_FALSE(TrustedTool(trusted + "/eu-stack").ok());
  EXPECT_TRUE(StackToolsFor(1234, false, planted + ":" + trusted).empty());
  ASSERT_EQ(
      ::symlink((planted + "/eu-stack").c_str(), (dir_ + "/link").c_str()), 0);
  EXPECT_FALSE(TrustedTool(dir_ + "/link").ok());
  EXPECT_TRUE(TrustedTool("/bin/sh").ok());
}

TEST_F(StackCollectorTest, StopKillsTheRunningToolsAndRepliesNoMore) {
  FakeTool("eu-stack", "echo $$ > " + dir_ + "/tool.pid; exec sleep 60");
  Make(Fakes());
  Child sleeper({"sleep", "60"});
  collector_->Collect(1, sleeper.pid());
  ASSERT_TRUE(RunUntil(io_, [&] {
    return std::filesystem::exists(dir_ + "/tool.pid") &&
           std::filesystem::file_size(dir_ + "/tool.pid") > 0;
  }));
  pid_t tool = 0;
  std::ifstream(dir_ + "/tool.pid") >> tool;
  collector_->Stop();
  RunUntil(io_, [&] { return collector_->running() == 0; });
  EXPECT_EQ(collector_->running(), 0u);
  EXPECT_TRUE(replies_.empty());
  EXPECT_FALSE(Alive(tool));
}

}  // namespace
}  // namespace dslaunch::agent
