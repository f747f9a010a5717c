#include "launcher/supervise/job_watch.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <boost/asio/io_context.hpp>
#include <memory>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "tests/common/temp_fd.h"

namespace dslaunch::launcher {
namespace {

using dslaunch::testing::ReadFd;
using dslaunch::testing::TempFd;
using json = nlohmann::ordered_json;
using std::chrono::milliseconds;

Plan OneNode(int ranks) {
  Plan plan;
  NodePlan node{0, "node-a", {}, 0, {}, {}};
  for (int i = 0; i < ranks; ++i) node.slots.push_back(i);
  plan.nodes.push_back(node);
  plan.world_size = ranks;
  return plan;
}

class JobWatchTest : public ::testing::Test {
 protected:
  JobWatchTest() : out_(TempFd()), err_(TempFd()) {
    Console::Options options;
    options.drain_stall = milliseconds(500);
    console_ = std::make_unique<Console>(out_, err_, options);
    EXPECT_TRUE(console_->Open(OneNode(4), "").ok());
    options_.hang_timeout_s = 30;
    options_.straggler_k = 5;
  }
  ~JobWatchTest() override {
    watch_.reset();
    console_.reset();
    ::close(out_);
    ::close(err_);
  }

  JobWatch& Watch() {
    JobWatch::Hooks hooks;
    hooks.collect_stacks = [this](const std::vector<int>& ranks,
                                  const std::string& reason) {
      stacks_asked_.push_back(ranks);
      reasons_.push_back(reason);
    };
    hooks.abort = [this](int rank, const std::string& why) {
      aborts_.emplace_back(rank, why);
    };
    watch_ = std::make_unique<JobWatch>(io_, options_, *console_, hooks);
    return *watch_;
  }
  RankBoard& board() { return console_->board(); }
  // What the console wrote to stderr since the last call.
  std::string Notes() {
    console_->DrainTerminal();
    std::string all = ReadFd(err_);
    std::string fresh = all.substr(seen_);
    seen_ = all.size();
    return fresh;
  }
  // Every rank started at 1000 (pid 100 + rank).
  void StartAll() {
    for (int r = 0; r < 4; ++r) board().Started(r, 100 + r, 1000);
  }

  boost::asio::io_context io_;
  LaunchOptions options_;
  int out_, err_;
  std::unique_ptr<Console> console_;
  std::unique_ptr<JobWatch> watch_;
  size_t seen_ = 0;
  std::vector<std::vector<int>> stacks_asked_;
  std::vector<std::string> reasons_;
  std::vector<std::pair<int, std::string>> aborts_;
};

const char kRank2Hang[] =
    "rank 2 on node-a (pid 102) sent no progress record for 31 s while "
    "running (last at step 7) (--hang_timeout 30)";

// Ranks 0, 1, 3 reported at 1025, rank 2 last at 1005 (step 7).
void Rank2FallsSilent(RankBoard& board) {
  for (int r = 0; r < 4; ++r)
    board.Record(r, json{{"step", 7}}, r == 2 ? 1005 : 1025);
}

TEST_F(JobWatchTest, NamesASilentRunningRankOnce) {
  StartAll();
  Rank2FallsSilent(board());
  JobWatch& watch = Watch();
  watch.Check(1035);  // 30 s: not yet
  EXPECT_EQ(Notes(), "");
  EXPECT_TRUE(stacks_asked_.empty());

  watch.Check(1036);
  EXPECT_EQ(Notes(), std::string("dslaunch: HANG: ") + kRank2Hang +
                         "; collecting its stacks\n");
  EXPECT_EQ(stacks_asked_, std::vector<std::vector<int>>{{2}});
  EXPECT_EQ(reasons_,
            std::vector<std::string>{"no progress for --hang_timeout"});
  EXPECT_TRUE(aborts_.empty());  // --on_hang warn
  EXPECT_TRUE(board().ranks().at(2).hung);
  ASSERT_EQ(watch.hangs().size(), 1u);
  EXPECT_EQ(watch.hangs().at(2), kRank2Hang);

  watch.Check(1037);
  watch.Check(1050);  // the others reported at 1025
  EXPECT_EQ(Notes(), "");
  EXPECT_EQ(stacks_asked_.size(), 1u);
}

TEST_F(JobWatchTest, AbortsOnlyWithOnHangAbort) {
  options_.on_hang = "abort";
  StartAll();
  Rank2FallsSilent(board());
  JobWatch& watch = Watch();
  watch.Check(1036);
  EXPECT_EQ(stacks_asked_, std::vector<std::vector<int>>{{2}});
  ASSERT_EQ(aborts_.size(), 1u);
  EXPECT_EQ(aborts_[0].first, 2);
  EXPECT_EQ(aborts_[0].second, kRank2Hang);
  watch.Check(1037);
  EXPECT_EQ(aborts_.size(), 1u);
}

TEST_F(JobWatchTest, AsksForTheStacksOfEveryRankFallenSilentAtOnce) {
  options_.on_hang = "abort";
  StartAll();
  board().Record(0, json{{"step", 1}}, 1025);
  board().Record(3, json{{"step", 1}}, 1025);
  JobWatch& watch = Watch();
  watch.Check(1040);  // ranks 1 and 2: nothing since their start at 1000
  EXPECT_EQ(stacks_asked_, (std::vector<std::vector<int>>{{1, 2}}));
  ASSERT_EQ(aborts_.size(), 1u);
  EXPECT_EQ(aborts_[0].first, 1);
  EXPECT_EQ(watch.hangs().at(1),
            "rank 1 on node-a (pid 101) sent no progress record for 40 s "
            "while running (none since it started) (--hang_timeout 30)");
  const std::string notes = Notes();
  EXPECT_NE(notes.find("HANG: rank 1 on node-a"), std::string::npos) << notes;
  EXPECT_NE(notes.find("HANG: rank 2 on node-a"), std::string::npos) << notes;
}

TEST_F(JobWatchTest, SaysWhenAHungRankReportsProgressAgain) {
  options_.straggler_k = 0;  // rank 2's steps are slow: not the point here
  StartAll();
  Rank2FallsSilent(board());
  JobWatch& watch = Watch();
  watch.Check(1036);
  Notes();
  board().Record(2, json{{"step", 8}}, 1040);
  for (int r : {0, 1, 3}) board().Record(r, json{{"step", 8}}, 1040);
  watch.Check(1041);
  EXPECT_EQ(Notes(), "dslaunch: rank 2 on node-a reports progress again\n");
  watch.Check(1042);
  EXPECT_EQ(Notes(), "");  // said once

  // Silent again later: named again, its stacks asked for again.
  for (int r : {0, 1, 3}) board().Record(r, json{{"step", 9}}, 1070);
  watch.Check(1071);
  const std::string notes = Notes();
  EXPECT_NE(notes.find("HANG: rank 2 on node-a (pid 102) sent no progress "
                       "record for 31 s while running (last at step 8)"),
            std::string::npos)
      << notes;
  EXPECT_EQ(stacks_asked_, (std::vector<std::vector<int>>{{2}, {2}}));
}

TEST_F(JobWatchTest, SaysNothingWhenAHungRankExits) {
  StartAll();
  Rank2FallsSilent(board());
  JobWatch& watch = Watch();
  watch.Check(1036);
  Notes();
  board().Exited(2, 1, 0, false);
  watch.Check(1037);
  watch.Check(5000);  // exited ranks are never silent
  const std::string notes = Notes();
  EXPECT_EQ(notes.find("rank 2"), std::string::npos) << notes;
  EXPECT_EQ(notes.find("reports progress again"), std::string::npos) << notes;
}

TEST_F(JobWatchTest, NeverNamesPendingOrExitedRanks) {
  board().Started(0, 100, 1000);
  board().Exited(0, 0, 0, false);
  JobWatch& watch = Watch();
  watch.Check(1e6);  // ranks 1-3 never started
  EXPECT_EQ(Notes(), "");
  EXPECT_TRUE(stacks_asked_.empty());
  EXPECT_TRUE(watch.hangs().empty());
}

TEST_F(JobWatchTest, HangTimeoutZeroTurnsTheCheckOff) {
  options_.hang_timeout_s = 0;
  options_.on_hang = "abort";
  StartAll();
  Rank2FallsSilent(board());
  JobWatch& watch = Watch();
  watch.Check(1e9);
  EXPECT_EQ(Notes(), "");
  EXPECT_TRUE(stacks_asked_.empty());
  EXPECT_TRUE(aborts_.empty());
  EXPECT_FALSE(board().ranks().at(2).hung);
  EXPECT_TRUE(watch.hangs().empty());
}

// Rank 3 takes 2 s per step, the others 1 s (10 steps each).
void Rank3Straggles(RankBoard& board) {
  for (int r = 0; r < 4; ++r) {
    board.Record(r, json{{"step", 0}}, 1000);
    board.Record(r, json{{"step", 10}}, r == 3 ? 1020 : 1010);
  }
}

TEST_F(JobWatchTest, WarnsOfAStragglerOnce) {
  StartAll();
  Rank3Straggles(board());
  JobWatch& watch = Watch();
  watch.Check(1021);
  EXPECT_EQ(Notes(),
            "dslaunch: STRAGGLER: rank 3 on node-a takes 2 s per step against "
            "the job's median 1 s (--straggler_k 5); said once\n");
  EXPECT_TRUE(board().ranks().at(3).straggler);
  EXPECT_FALSE(board().ranks().at(0).straggler);
  EXPECT_EQ(watch.stragglers(), std::set<int>{3});
  watch.Check(1022);
  watch.Check(1023);
  EXPECT_EQ(Notes(), "");
  EXPECT_TRUE(stacks_asked_.empty());
}

TEST_F(JobWatchTest, ClearsTheStragglerMarkOfARankNoLongerSlow) {
  StartAll();
  Rank3Straggles(board());
  JobWatch& watch = Watch();
  watch.Check(1021);
  Notes();
  board().Exited(3, 0, 0, false);
  watch.Check(1022);
  EXPECT_FALSE(board().ranks().at(3).straggler);
  EXPECT_EQ(Notes(), "");
  EXPECT_EQ(watch.stragglers(), std::set<int>{3});  // what was said stays
}

TEST_F(JobWatchTest, StragglerKZeroTurnsTheCheckOff) {
  options_.straggler_k = 0;
  StartAll();
  Rank3Straggles(board());
  JobWatch& watch = Watch();
  watch.Check(1021);
  EXPECT_EQ(Notes(), "");
  EXPECT_FALSE(board().ranks().at(3).straggler);
  EXPECT_TRUE(watch.stragglers().empty());
}

}  // namespace
}  // namespace dslaunch::launcher
