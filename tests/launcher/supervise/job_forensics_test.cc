#include "launcher/supervise/job_forensics.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <boost/asio/io_context.hpp>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "tests/common/temp_fd.h"

namespace dslaunch::launcher {
namespace {

using dslaunch::testing::ReadFd;
using dslaunch::testing::TempFd;
using std::chrono::milliseconds;

class JobForensicsTest : public ::testing::Test {
 protected:
  JobForensicsTest()
      : out_(TempFd()),
        err_(TempFd()),
        plan_(JoinPlan({"a", "b"}, {2, 2}, PlanOptions())),
        state_(plan_) {
    Console::Options options;
    options.drain_stall = milliseconds(500);
    console_ = std::make_unique<Console>(out_, err_, options);
    EXPECT_TRUE(console_->Open(plan_, "").ok());
    forensics_ = std::make_unique<JobForensics>(
        io_, options_, *console_, state_,
        JobForensics::Hooks{[this](int node, const wire::Envelope& msg) {
                              sent_.emplace_back(node, msg);
                            },
                            [this](int rank, const std::string& why) {
                              hung_.emplace_back(rank, why);
                            }});
    for (int node = 0; node < 2; ++node)
      EXPECT_TRUE(state_.NodeAuthenticated(node).ok());
    // Ranks 0-2 run; rank 3 never started.
    for (int rank = 0; rank < 3; ++rank)
      EXPECT_TRUE(state_.RankStarted(rank / 2, rank, 100 + rank).ok());
  }
  ~JobForensicsTest() override {
    forensics_.reset();
    console_.reset();
    ::close(out_);
    ::close(err_);
  }
  std::string Notes() {
    console_->DrainTerminal();
    return ReadFd(err_);
  }
  wire::Stacks Stacks(int rank, std::string text) {
    wire::Stacks s;
    s.set_rank(rank);
    s.set_tool("eu-stack");
    s.set_text(std::move(text));
    return s;
  }

  boost::asio::io_context io_;
  LaunchOptions options_;
  int out_, err_;
  Plan plan_;
  JobState state_;
  std::unique_ptr<Console> console_;
  std::unique_ptr<JobForensics> forensics_;
  std::vector<std::pair<int, wire::Envelope>> sent_;
  std::vector<std::pair<int, std::string>> hung_;
};

TEST_F(JobForensicsTest, AsksEachNodeOnceForItsRunningRanksOnly) {
  forensics_->CollectStacks({0, 1, 2, 3, 9}, "hang: rank 2");
  ASSERT_EQ(sent_.size(), 2u);
  EXPECT_EQ(sent_[0].first, 0);
  EXPECT_EQ(sent_[0].second.collect_stacks().ranks_size(), 2);
  EXPECT_EQ(sent_[1].first, 1);
  ASSERT_EQ(sent_[1].second.collect_stacks().ranks_size(), 1);
  EXPECT_EQ(sent_[1].second.collect_stacks().ranks(0), 2);  // not 3 or 9
  EXPECT_EQ(sent_[1].second.collect_stacks().reason(), "hang: rank 2");
}

TEST_F(JobForensicsTest, AHangAbortWaitsForTheStacksAskedFor) {
  forensics_->CollectStacks({1, 2}, "hang");
  forensics_->AbortForHang(2, "rank 2 hung");
  EXPECT_TRUE(hung_.empty()) << "the stacks' tools must not race the stop";
  forensics_->OnStacks(Stacks(1, "#0 main\n"));
  EXPECT_TRUE(hung_.empty());
  forensics_->OnStacks(Stacks(2, "#0 poll\n#1 main\n"));
  ASSERT_EQ(hung_.size(), 1u);
  EXPECT_EQ(hung_[0], std::make_pair(2, std::string("rank 2 hung")));
  EXPECT_EQ(forensics_->stacks().at(2), "#0 poll\n#1 main\n");
  const std::string notes = Notes();
  EXPECT_NE(notes.find("stacks of rank 2 (eu-stack)"), std::string::npos)
      << notes;
  EXPECT_NE(notes.find("  | #0 poll"), std::string::npos) << notes;
  forensics_->AbortForHang(1, "again");  // once only
  EXPECT_EQ(hung_.size(), 1u);
}

TEST_F(JobForensicsTest, AHangAbortWithNoStacksPendingIsAtOnce) {
  forensics_->AbortForHang(0, "rank 0 hung");
  ASSERT_EQ(hung_.size(), 1u);
  EXPECT_EQ(hung_[0].first, 0);
}

TEST_F(JobForensicsTest, StacksWithEscapesOrAnErrorAreSaidEscaped) {
  wire::Stacks s = Stacks(0, "");
  s.set_error("tool said \x1b[2J no");
  forensics_->OnStacks(s);
  forensics_->OnStacks(Stacks(1, "#0 \x1b]0;title\x07 frame\n"));
  const std::string notes = Notes();
  EXPECT_EQ(notes.find('\x1b'), std::string::npos) << notes;
  EXPECT_NE(notes.find("no stacks of rank 0: tool said"), std::string::npos)
      << notes;
  EXPECT_FALSE(forensics_->stacks().count(0));
  EXPECT_TRUE(forensics_->stacks().count(1));
}

TEST_F(JobForensicsTest, KeepsOomKillsAndBoundedErrorFiles) {
  wire::WorkerExited e;
  e.set_rank(1);
  e.set_oom_killed(true);
  e.set_oom_detail("Killed process 101");
  e.set_error_file(std::string(100 << 10, 'x'));
  forensics_->OnExited(e);
  EXPECT_EQ(forensics_->oom().at(1), "Killed process 101");
  EXPECT_EQ(forensics_->error_files().at(1).size(), 64u << 10);
  wire::WorkerExited fine;
  fine.set_rank(0);
  forensics_->OnExited(fine);
  EXPECT_FALSE(forensics_->oom().count(0));
  EXPECT_FALSE(forensics_->error_files().count(0));
}

}  // namespace
}  // namespace dslaunch::launcher
