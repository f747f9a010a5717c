#include "agent/stack_helper.h"

#include <gtest/gtest.h>
#include <signal.h>    // kill
#include <stdlib.h>    // mkdtemp
#include <sys/stat.h>  // chmod
#include <unistd.h>    // getpid

#include <boost/asio/io_context.hpp>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "base/process_tree.h"  // ParentOf, IsLiveProcess
#include "tests/common/child_process.h"
#include "tests/common/run_until.h"

namespace dslaunch::agent {
namespace {

namespace asio = boost::asio;
using dslaunch::testing::RunUntil;
using std::chrono::milliseconds;

// The helper is the real one (dsagent --stack_helper) and its tools are
// fakes in this test's own directory, which is the helper's whole PATH.
class StackHelperTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/dsl-helper-test-XXXXXX";
    dir_ = ::mkdtemp(tmpl);
  }
  void TearDown() override {
    client_.reset();
    RunUntil(
        io_, [] { return false; }, milliseconds(50));  // reap it
    std::filesystem::remove_all(dir_);
  }
  void FakeTool(const std::string& name, const std::string& script) {
    const std::string path = dir_ + "/" + name;
    std::ofstream(path) << "#!/bin/sh\nPATH=/usr/bin:/bin\n" << script << "\n";
    ASSERT_EQ(::chmod(path.c_str(), 0755), 0);
  }
  void Make(StackHelperOptions o = {}) {
    if (o.argv.empty()) o.argv = {DSL_DSAGENT, kStackHelperFlag};
    o.path_env = dir_;
    client_ = std::make_unique<StackHelperClient>(
        io_, [this](const wire::Stacks& s) { replies_.push_back(s); }, o);
  }
  bool WaitReplies(size_t n, milliseconds timeout = milliseconds(10000)) {
    return RunUntil(
        io_, [&] { return replies_.size() >= n; }, timeout);
  }
  bool WaitFile(const std::string& name) {
    return RunUntil(
        io_, [&] { return std::filesystem::exists(dir_ + "/" + name); },
        milliseconds(10000));
  }
  pid_t ReadPid(const std::string& name) {
    pid_t pid = -1;
    std::ifstream(dir_ + "/" + name) >> pid;
    return pid;
  }

  asio::io_context io_;
  std::string dir_;
  std::unique_ptr<StackHelperClient> client_;
  std::vector<wire::Stacks> replies_;
  dslaunch::testing::ChildProcess rank_{{"sleep", "60"}};
};

TEST_F(StackHelperTest, TheToolIsAChildOfTheHelperWhichIsAChildOfTheAgent) {
  FakeTool("eu-stack",
           "echo \"tool's parent: $PPID\"\n"
           "printf \"parent's command: \"; tr '\\0' ' ' < /proc/$PPID/cmdline");
  Make();
  const pid_t helper = client_->Tracer();
  ASSERT_GT(helper, 0);
  EXPECT_NE(helper, ::getpid());  // the ranks' tracer is never the agent
  EXPECT_EQ(base::ParentOf(helper), ::getpid());
  EXPECT_EQ(client_->Tracer(), helper);  // one helper, started once
  client_->Collect(3, rank_.pid());
  ASSERT_TRUE(WaitReplies(1));
  const wire::Stacks& s = replies_[0];
  EXPECT_EQ(s.rank(), 3);
  EXPECT_EQ(s.error(), "");
  EXPECT_EQ(s.tool(), "eu-stack");
  EXPECT_NE(s.text().find("tool's parent: " + std::to_string(helper) + "\n"),
            std::string::npos)
      << s.text();
  EXPECT_NE(s.text().find(std::string(kStackHelperFlag)), std::string::npos)
      << s.text();
  RunUntil(
      io_, [] { return false; }, milliseconds(200));
  EXPECT_EQ(replies_.size(), 1u);  // exactly one answer
  EXPECT_EQ(client_->pending(), 0u);
}

TEST_F(StackHelperTest, CollectionsOfTheSameRankAreMergedIntoOneAnswer) {
  FakeTool("eu-stack", "sleep 0.3; echo frames");
  Make();
  client_->Collect(3, rank_.pid());
  client_->Collect(3, rank_.pid());
  client_->Collect(4, rank_.pid());
  ASSERT_TRUE(WaitReplies(2));
  RunUntil(
      io_, [] { return false; }, milliseconds(200));
  ASSERT_EQ(replies_.size(), 2u);
  EXPECT_EQ(replies_[0].text(), "frames\n");
  EXPECT_EQ(replies_[1].text(), "frames\n");
}

TEST_F(StackHelperTest, AKilledHelperIsAnErrorAnswerNamingItNotAHang) {
  FakeTool("eu-stack", "echo $$ > \"$0.pid\"; exec sleep 30");
  Make();
  const pid_t helper = client_->Tracer();
  client_->Collect(3, rank_.pid());
  ASSERT_TRUE(WaitFile("eu-stack.pid"));
  const pid_t tool = ReadPid("eu-stack.pid");
  const auto killed_at = std::chrono::steady_clock::now();
  ASSERT_EQ(::kill(helper, SIGKILL), 0);
  ASSERT_TRUE(WaitReplies(1, milliseconds(5000)));  // the backstop is 22 s
  EXPECT_LT(std::chrono::steady_clock::now() - killed_at, milliseconds(5000));
  EXPECT_EQ(replies_[0].rank(), 3);
  EXPECT_NE(replies_[0].error().find("the stack helper (pid " +
                                     std::to_string(helper) + ") is gone"),
            std::string::npos)
      << replies_[0].error();
  EXPECT_EQ(client_->Tracer(), 0);  // a dead pid is never named again
  // Its tool died with it (PR_SET_PDEATHSIG): nothing traces the rank.
  EXPECT_TRUE(RunUntil(io_, [&] { return !base::IsLiveProcess(tool); }));
  client_->Collect(4, rank_.pid());  // answered at once
  ASSERT_EQ(replies_.size(), 2u);
  EXPECT_NE(replies_[1].error().find("is gone"), std::string::npos);
}

TEST_F(StackHelperTest, AHelperThatStopsAnsweringIsAnsweredByTheBackstop) {
  FakeTool("eu-stack", "echo frames");
  StackHelperOptions o;
  o.answer_within = milliseconds(300);
  Make(o);
  const pid_t helper = client_->Tracer();
  ASSERT_GT(helper, 0);
  ASSERT_EQ(::kill(helper, SIGSTOP), 0);
  client_->Collect(3, rank_.pid());
  ASSERT_TRUE(WaitReplies(1, milliseconds(3000)));
  EXPECT_EQ(replies_[0].error(),
            "no stacks: the stack helper gave no answer within 300 ms");
  ::kill(helper, SIGCONT);
  // Its late answer is dropped: still one answer for the one request.
  RunUntil(
      io_, [] { return false; }, milliseconds(500));
  EXPECT_EQ(replies_.size(), 1u);
}

TEST_F(StackHelperTest, AnExitedRankGetsNoFurtherToolInTheHelper) {
  // eu-stack fails after a while; gdb would give frames, but the rank
  // exited meanwhile and its pid may be someone else's by now.
  FakeTool("eu-stack", "touch \"$0.ran\"; sleep 0.5; exit 1");
  FakeTool("gdb", "echo gdb frames");
  Make();
  client_->Collect(3, rank_.pid());
  ASSERT_TRUE(WaitFile("eu-stack.ran"));
  client_->Exited(3);
  ASSERT_TRUE(WaitReplies(1));
  EXPECT_EQ(replies_[0].text(), "");
  EXPECT_NE(replies_[0].error().find("the rank exited"), std::string::npos)
      << replies_[0].error();
}

TEST_F(StackHelperTest, StopEndsTheHelperAndItsToolsAndAnswersNothing) {
  FakeTool("eu-stack", "echo $$ > \"$0.pid\"; exec sleep 30");
  Make();
  const pid_t helper = client_->Tracer();
  client_->Collect(3, rank_.pid());
  ASSERT_TRUE(WaitFile("eu-stack.pid"));
  const pid_t tool = ReadPid("eu-stack.pid");
  client_->Stop();
  // The helper ends by itself on the end of its connection.
  EXPECT_TRUE(RunUntil(io_, [&] {
    return !base::IsLiveProcess(helper) && !base::IsLiveProcess(tool);
  }));
  EXPECT_TRUE(replies_.empty());
  client_->Collect(4, rank_.pid());
  RunUntil(
      io_, [] { return false; }, milliseconds(100));
  EXPECT_TRUE(replies_.empty());
}

TEST_F(StackHelperTest, ARequestForPidZeroEndsTheHelperInsteadOfAGroup) {
  FakeTool("eu-stack", "echo $$ > \"$0.pid\"; echo frames");
  Make();
  client_->Collect(3, 0);  // eu-stack -p 0, kill(0, SIGCONT): never
  ASSERT_TRUE(WaitReplies(1));
  EXPECT_NE(replies_[0].error().find("is gone"), std::string::npos);
  EXPECT_FALSE(std::filesystem::exists(dir_ + "/eu-stack.pid"));
}

TEST_F(StackHelperTest, WithoutAHelperNoRankNamesATracerAndStacksAreRefused) {
  StackHelperOptions o;
  o.argv = {"/nonexistent/dsagent", kStackHelperFlag};
  Make(o);
  // It cannot run: ranks name nobody, collections say why.
  EXPECT_EQ(client_->Tracer(), 0);
  client_->Collect(3, rank_.pid());
  ASSERT_TRUE(WaitReplies(1));
  EXPECT_NE(replies_[0].error().find("no stacks: the stack helper"),
            std::string::npos)
      << replies_[0].error();
}

}  // namespace
}  // namespace dslaunch::agent
