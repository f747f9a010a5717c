#include "launcher/supervise/rank_traffic.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <boost/asio/io_context.hpp>
#include <memory>
#include <string>

#include "tests/common/temp_fd.h"

namespace dslaunch::launcher {
namespace {

using dslaunch::testing::ReadFd;
using dslaunch::testing::TempFd;

// Nodes a and b, ranks 0-1 on a and 2-3 on b.
class RankTrafficTest : public ::testing::Test {
 protected:
  RankTrafficTest()
      : out_(TempFd()),
        err_(TempFd()),
        plan_(JoinPlan({"a", "b"}, {2, 2}, PlanOptions())),
        state_(plan_) {
    console_ = std::make_unique<Console>(out_, err_, Console::Options());
    EXPECT_TRUE(console_->Open(plan_, "").ok());
    forensics_ = std::make_unique<JobForensics>(io_, options_, *console_,
                                                state_, JobForensics::Hooks{});
    traffic_ = std::make_unique<RankTraffic>(state_, *console_, *forensics_);
  }
  ~RankTrafficTest() override {
    traffic_.reset();
    forensics_.reset();
    console_.reset();
    ::close(out_);
    ::close(err_);
  }
  std::string Out() {
    console_->DrainTerminal();
    return ReadFd(out_);
  }

  int out_, err_;
  boost::asio::io_context io_;
  LaunchOptions options_;
  Plan plan_;
  JobState state_;
  std::unique_ptr<Console> console_;
  std::unique_ptr<JobForensics> forensics_;
  std::unique_ptr<RankTraffic> traffic_;
};

TEST_F(RankTrafficTest, AnAgentSpeaksForItsOwnRanksOnly) {
  wire::Envelope env;
  auto* mine = env.mutable_log_batch()->add_entries();
  mine->set_rank(1);
  mine->set_line("from rank 1");
  auto* theirs = env.mutable_log_batch()->add_entries();
  theirs->set_rank(2);  // node b's
  theirs->set_line("forged for rank 2");
  EXPECT_TRUE(traffic_->Route(0, env));
  const std::string out = Out();
  EXPECT_NE(out.find("from rank 1"), std::string::npos) << out;
  EXPECT_EQ(out.find("forged"), std::string::npos) << out;
}

TEST_F(RankTrafficTest, CountsWhatEachRanksAgentDroppedForTheReport) {
  for (int i = 0; i < 2; ++i) {
    wire::Envelope env;
    (*env.mutable_progress_batch()->mutable_malformed())[3] = 2;
    (*env.mutable_progress_batch()->mutable_dropped())[2] = 5;
    (*env.mutable_progress_batch()->mutable_dropped())[0] = 7;  // node a's
    EXPECT_TRUE(traffic_->Route(1, env));
  }
  EXPECT_EQ(traffic_->malformed(), (std::map<int, int64_t>{{3, 4}}));
  EXPECT_EQ(traffic_->dropped(), (std::map<int, int64_t>{{2, 10}}));
}

TEST_F(RankTrafficTest, LeavesOtherMessagesToTheJob) {
  wire::Envelope env;
  env.mutable_worker_exited()->set_rank(0);
  EXPECT_FALSE(traffic_->Route(0, env));
  env.mutable_agent_done();
  EXPECT_FALSE(traffic_->Route(0, env));
}

}  // namespace
}  // namespace dslaunch::launcher
