#include "launcher/report/rank_board.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace dslaunch::launcher {
namespace {

using json = nlohmann::ordered_json;
using State = RankView::State;

// node-a: ranks 0-3, node-b: ranks 4-7 (node-b's slots are 4..7, which
// become CUDA devices, not ranks).
Plan TwoNodes() {
  Plan plan;
  plan.nodes.push_back(NodePlan{0, "node-a", {0, 1, 2, 3}, 0, {}, {}});
  plan.nodes.push_back(NodePlan{1, "node-b", {4, 5, 6, 7}, 4, {}, {}});
  plan.world_size = 8;
  return plan;
}

RankBoard Board(const Plan& plan = TwoNodes()) {
  RankBoard board;
  board.Reset(plan);
  return board;
}

const RankView& View(const RankBoard& board, int rank) {
  return board.ranks().at(rank);
}

TEST(RankBoard, HasEveryRankOfThePlanPendingWithItsHost) {
  const RankBoard board = Board();
  EXPECT_EQ(board.num_nodes(), 2);
  ASSERT_EQ(board.ranks().size(), 8u);
  for (const auto& [rank, r] : board.ranks()) {
    EXPECT_EQ(r.rank, rank);
    EXPECT_EQ(r.state, State::kPending);
    EXPECT_EQ(r.host, rank < 4 ? "node-a" : "node-b");
    EXPECT_EQ(r.node_rank, rank < 4 ? 0 : 1);
    EXPECT_EQ(r.rss_bytes, -1);
    EXPECT_FALSE(r.step.has_value());
  }
}

TEST(RankBoard, ResetWithAnotherPlanForgetsTheOldRanks) {
  RankBoard board = Board();
  board.Record(5, json{{"step", 3}}, 100);
  Plan join;
  join.nodes.push_back(NodePlan{0, "real-host", {0, 1}, 0, {}, {}});
  board.Reset(join);
  EXPECT_EQ(board.num_nodes(), 1);
  ASSERT_EQ(board.ranks().size(), 2u);
  EXPECT_EQ(View(board, 1).host, "real-host");
  EXPECT_EQ(board.ranks().count(5), 0u);
}

TEST(RankBoard, TakesStepLossAndTokensFromARecord) {
  RankBoard board = Board();
  board.Record(2,
               json{{"step", 12},
                    {"total_steps", 20},
                    {"loss", 2.5},
                    {"tokens_per_s", 51200.0}},
               1000.5);
  const RankView& r = View(board, 2);
  EXPECT_EQ(r.step, 12);
  EXPECT_EQ(r.total_steps, 20);
  EXPECT_EQ(r.loss, 2.5);
  EXPECT_EQ(r.tokens_per_s, 51200.0);
  EXPECT_EQ(r.records, 1);
  EXPECT_EQ(r.last_record_at, 1000.5);
  // Nothing reached the other ranks.
  EXPECT_EQ(View(board, 1).records, 0);
  EXPECT_FALSE(View(board, 1).step.has_value());
}

TEST(RankBoard, TakesOnlyIntegralNonNegativeStepCounts) {
  RankBoard board = Board();
  board.Record(0, json{{"step", 7}, {"total_steps", 100}}, 1);
  for (const json& bad :
       {json(-1), json(7.5), json("8"), json(true), json(1e16), json(nullptr),
        json::array({9}), json(std::numeric_limits<double>::infinity())}) {
    board.Record(0, json{{"step", bad}, {"total_steps", bad}}, 2);
    EXPECT_EQ(View(board, 0).step, 7) << bad.dump();
    EXPECT_EQ(View(board, 0).total_steps, 100) << bad.dump();
  }
  board.Record(0, json{{"step", 8.0}, {"total_steps", 0}}, 3);
  EXPECT_EQ(View(board, 0).step, 8);
  EXPECT_EQ(View(board, 0).total_steps, 0);
  board.Record(0, json{{"step", uint64_t{9000000000000000}}}, 4);
  EXPECT_EQ(View(board, 0).step, int64_t{9000000000000000});
}

TEST(RankBoard, KeepsTheStepOfARecordWithoutOne) {
  RankBoard board = Board();
  board.Record(0, json{{"step", 7}}, 1);
  board.Record(0, json{{"loss", 1.0}}, 2);
  EXPECT_EQ(View(board, 0).step, 7);
  EXPECT_EQ(View(board, 0).loss, 1.0);
  EXPECT_EQ(View(board, 0).records, 2);
}

TEST(RankBoard, KeepsTheLastKHistoryLosses) {
  RankBoard board = Board();
  for (int i = 0; i < 30; ++i)
    board.Record(1, json{{"loss", double(i)}}, i + 1);
  const auto& history = View(board, 1).loss_history;
  ASSERT_EQ(history.size(), RankBoard::kHistory);
  EXPECT_EQ(history.front(), 30.0 - RankBoard::kHistory);
  EXPECT_EQ(history.back(), 29.0);
  EXPECT_EQ(View(board, 1).loss, 29.0);
}

// A diverged loss is shown (as the agent writes it: "NaN", "Infinity"),
// kept out of the sparkline; strings, booleans and objects are not numbers.
TEST(RankBoard, KeepsNonFiniteValuesAndIgnoresNonNumericOnes) {
  RankBoard board = Board();
  board.Record(0, json{{"loss", 2.0}, {"tokens_per_s", 10.0}}, 1);
  board.Record(0,
               json{{"loss", "NaN"},
                    {"tokens_per_s", "Infinity"},
                    {"lr", "-Infinity"},
                    {"name", "x"},
                    {"flag", true},
                    {"nested", json{{"a", 1}}},
                    {"grad_norm", 0.5}},
               2);
  const RankView& r = View(board, 0);
  ASSERT_TRUE(r.loss.has_value());
  EXPECT_TRUE(std::isnan(*r.loss));
  EXPECT_EQ(r.tokens_per_s, std::numeric_limits<double>::infinity());
  EXPECT_EQ(r.loss_history, (std::deque<double>{2.0}));
  ASSERT_EQ(r.scalars.size(), 4u);
  EXPECT_EQ(r.scalars[0].first, "loss");
  EXPECT_TRUE(std::isnan(r.scalars[0].second));
  EXPECT_EQ(r.scalars[2],
            std::make_pair(std::string("lr"),
                           -std::numeric_limits<double>::infinity()));
  EXPECT_EQ(r.scalars[3], std::make_pair(std::string("grad_norm"), 0.5));
  EXPECT_EQ(r.records, 2);
  // A non-finite step is no step.
  board.Record(0, json{{"step", "NaN"}}, 3);
  EXPECT_FALSE(View(board, 0).step.has_value());
}

TEST(RankBoard, KeepsTheLastRecordsNumbersAsScalarsInTheirOrder) {
  RankBoard board = Board();
  board.Record(0, json{{"lr", 1.0}, {"old", 2.0}}, 1);
  board.Record(0,
               json{{"step", 3},
                    {"total_steps", 10},
                    {"zeta", 1},
                    {"loss", 2.5},
                    {"alpha", -4}},
               2);
  using Scalars = std::vector<std::pair<std::string, double>>;
  EXPECT_EQ(View(board, 0).scalars,
            (Scalars{{"zeta", 1.0}, {"loss", 2.5}, {"alpha", -4.0}}));
}

TEST(RankBoard, BoundsTheNumberOfScalars) {
  RankBoard board = Board();
  json record = json::object();
  for (size_t i = 0; i < RankBoard::kMaxScalars + 10; ++i)
    record["m" + std::to_string(i)] = double(i);
  board.Record(3, record, 1);
  const auto& scalars = View(board, 3).scalars;
  ASSERT_EQ(scalars.size(), RankBoard::kMaxScalars);
  EXPECT_EQ(scalars.front().first, "m0");
  EXPECT_EQ(scalars.back().first,
            "m" + std::to_string(RankBoard::kMaxScalars - 1));
}

TEST(RankBoard, StillReadsKnownFieldsPastTheScalarBound) {
  RankBoard board = Board();
  json record = json::object();
  for (size_t i = 0; i < RankBoard::kMaxScalars + 5; ++i)
    record["m" + std::to_string(i)] = double(i);
  record["step"] = 11;
  record["loss"] = 0.25;
  board.Record(3, record, 1);
  EXPECT_EQ(View(board, 3).step, 11);
  EXPECT_EQ(View(board, 3).loss, 0.25);
  EXPECT_EQ(View(board, 3).scalars.size(), RankBoard::kMaxScalars);
}

TEST(RankBoard, DropsScalarsWithOverlongOrEmptyNames) {
  RankBoard board = Board();
  const std::string longest(RankBoard::kMaxScalarName, 'k');
  const std::string too_long(RankBoard::kMaxScalarName + 1, 'k');
  board.Record(0, json{{too_long, 1.0}, {"", 2.0}, {longest, 3.0}}, 1);
  using Scalars = std::vector<std::pair<std::string, double>>;
  EXPECT_EQ(View(board, 0).scalars, (Scalars{{longest, 3.0}}));
}

TEST(RankBoard, IgnoresRecordsOfUnknownRanksAndNonObjects) {
  RankBoard board = Board();
  board.Record(8, json{{"step", 1}}, 1);
  board.Record(-1, json{{"step", 1}}, 1);
  board.Started(99, 1234, 1);
  board.Exited(99, 1, 0, false);
  board.Stats(99, 1 << 20);
  EXPECT_EQ(board.ranks().size(), 8u);
  EXPECT_EQ(board.ranks().count(8), 0u);
  board.Record(0, json::array({1, 2}), 1);
  board.Record(0, json(3), 1);
  EXPECT_EQ(View(board, 0).records, 0);
  EXPECT_EQ(View(board, 0).last_record_at, 0);
}

TEST(RankBoard, TracksStartExitAndMemory) {
  RankBoard board = Board();
  board.Started(1, 4242, 500.0);
  board.Stats(1, int64_t{3} << 30);
  EXPECT_EQ(View(board, 1).state, State::kRunning);
  EXPECT_EQ(View(board, 1).pid, 4242);
  EXPECT_EQ(View(board, 1).started_at, 500.0);
  EXPECT_EQ(View(board, 1).rss_bytes, int64_t{3} << 30);
  EXPECT_EQ(View(board, 1).gpu_mem_bytes, -1);
  board.Record(1, json{{"step", 1}, {"gpu_mem_bytes", int64_t{7} << 30}}, 501);
  EXPECT_EQ(View(board, 1).gpu_mem_bytes, int64_t{7} << 30);
  board.Record(1, json{{"step", 2}, {"gpu_mem_bytes", -5}}, 502);  // kept
  EXPECT_EQ(View(board, 1).gpu_mem_bytes, int64_t{7} << 30);
  board.MarkHung(1, true);
  board.Exited(1, 137, 9, true);
  const RankView& r = View(board, 1);
  EXPECT_EQ(r.state, State::kExited);
  EXPECT_EQ(r.exit_code, 137);
  EXPECT_EQ(r.signal, 9);
  EXPECT_TRUE(r.oom_killed);
  EXPECT_FALSE(r.hung);
}

TEST(RankBoard, ARecordClearsTheHungMark) {
  RankBoard board = Board();
  board.Started(0, 1, 100);
  board.MarkHung(0, true);
  EXPECT_TRUE(View(board, 0).hung);
  board.Record(0, json{{"step", 1}}, 200);
  EXPECT_FALSE(View(board, 0).hung);
}

// ---- step time ----

void Steps(RankBoard& board, int rank,
           const std::vector<std::pair<double, int64_t>>& records) {
  for (const auto& [time, step] : records)
    board.Record(rank, json{{"step", step}}, time);
}

TEST(RankBoard, HasNoStepTimeBeforeTwoStepsCame) {
  RankBoard board = Board();
  Steps(board, 0, {{1000, 5}});
  EXPECT_EQ(View(board, 0).step_time_s, 0);
  Steps(board, 0, {{1001, 5}});  // same step: no interval
  EXPECT_EQ(View(board, 0).step_time_s, 0);
  board.Record(0, json{{"loss", 1.0}}, 1002);  // no step
  EXPECT_EQ(View(board, 0).step_time_s, 0);
  EXPECT_EQ(board.MedianStepTime(), 0);
}

TEST(RankBoard, StepTimeIsTheMedianSecondsPerStep) {
  RankBoard board = Board();
  Steps(board, 0, {{1000, 0}, {1010, 10}});  // 1 s per step
  EXPECT_DOUBLE_EQ(View(board, 0).step_time_s, 1.0);
  Steps(board, 0, {{1016, 12}});  // 3 s per step: median of {1, 3}
  EXPECT_DOUBLE_EQ(View(board, 0).step_time_s, 2.0);
  Steps(board, 0, {{1017, 13}});  // {1, 3, 1}
  EXPECT_DOUBLE_EQ(View(board, 0).step_time_s, 1.0);
  Steps(board, 0, {{1020, 13}});  // the same step again changes nothing
  EXPECT_DOUBLE_EQ(View(board, 0).step_time_s, 1.0);
}

TEST(RankBoard, StepTimeForgetsIntervalsOlderThanTheLastKStepTimes) {
  RankBoard board = Board();
  double t = 1000;
  int64_t step = 0;
  for (size_t i = 0; i <= RankBoard::kStepTimes; ++i)
    Steps(board, 0, {{t += 1, ++step}});
  EXPECT_DOUBLE_EQ(View(board, 0).step_time_s, 1.0);
  for (size_t i = 0; i < RankBoard::kStepTimes; ++i)
    Steps(board, 0, {{t += 5, ++step}});
  EXPECT_DOUBLE_EQ(View(board, 0).step_time_s, 5.0);
  EXPECT_LE(View(board, 0).recent.size(), RankBoard::kStepTimes + 1);
}

TEST(RankBoard, StepTimeSkipsAStepThatWentBack) {
  RankBoard board = Board();
  Steps(board, 0, {{1000, 100}, {1001, 5}, {1003, 6}});  // restarted at 5
  EXPECT_DOUBLE_EQ(View(board, 0).step_time_s, 2.0);
}

TEST(RankBoard, MedianStepTimeIsOverRanksThatHaveOne) {
  RankBoard board = Board();
  Steps(board, 0, {{1000, 0}, {1001, 1}});
  Steps(board, 1, {{1000, 0}, {1003, 1}});
  Steps(board, 2, {{1000, 0}, {1010, 1}});
  Steps(board, 3, {{1000, 0}, {1004, 1}});
  EXPECT_DOUBLE_EQ(board.MedianStepTime(), 3.5);  // {1, 3, 4, 10}
}

// ---- Silent ----

TEST(RankBoard, SilentCountsFromTheStartBeforeTheFirstRecord) {
  RankBoard board = Board();
  board.Started(2, 1, 1000);
  EXPECT_EQ(board.Silent(1030, 30), std::vector<int>{});
  EXPECT_EQ(board.Silent(1031, 30), std::vector<int>{2});
}

TEST(RankBoard, SilentCountsFromTheLastRecord) {
  RankBoard board = Board();
  board.Started(2, 1, 1000);
  board.Record(2, json{{"step", 1}}, 1020);
  EXPECT_EQ(board.Silent(1045, 30), std::vector<int>{});
  EXPECT_EQ(board.Silent(1050.5, 30), std::vector<int>{2});
}

TEST(RankBoard, NeverNamesPendingOrExitedRanksSilent) {
  RankBoard board = Board();
  board.Started(0, 1, 1000);
  board.Started(1, 1, 1000);
  board.Exited(1, 0, 0, false);
  board.Started(2, 1, 1000);
  board.Record(2, json{{"step", 1}}, 1001);
  board.Exited(2, 1, 0, false);
  EXPECT_EQ(board.Silent(5000, 30), std::vector<int>{0});
}

TEST(RankBoard, NamesEverySilentRankInOrder) {
  RankBoard board = Board();
  for (int r = 0; r < 8; ++r) board.Started(r, 100 + r, 1000);
  for (int r : {1, 3, 4, 6}) board.Record(r, json{{"step", 1}}, 1100);
  EXPECT_EQ(board.Silent(1101, 60), (std::vector<int>{0, 2, 5, 7}));
}

// ---- Stragglers ----

// Every rank running, with `seconds` per step (10 steps).
RankBoard WithStepTimes(const std::vector<double>& seconds) {
  Plan plan;
  plan.nodes.push_back(NodePlan{0, "h", {}, 0, {}, {}});
  for (size_t i = 0; i < seconds.size(); ++i)
    plan.nodes[0].slots.push_back(static_cast<int>(i));
  RankBoard board = Board(plan);
  for (size_t i = 0; i < seconds.size(); ++i) {
    const int rank = static_cast<int>(i);
    board.Started(rank, 1, 900);
    if (seconds[i] > 0)
      Steps(board, rank, {{1000, 0}, {1000 + 10 * seconds[i], 10}});
  }
  return board;
}

TEST(RankBoard, NamesARankTwiceAsSlowAsTheOthers) {
  const RankBoard board = WithStepTimes({1.0, 1.0, 2.0, 1.0});
  EXPECT_EQ(board.Stragglers(5), std::vector<int>{2});
}

TEST(RankBoard, DoesNotNameARankTenPercentSlowerWhenTheMadIsZero) {
  EXPECT_EQ(WithStepTimes({1.0, 1.0, 1.1, 1.0}).Stragglers(5),
            std::vector<int>{});
  EXPECT_EQ(WithStepTimes({1.0, 1.0, 1.05, 1.0}).Stragglers(5),
            std::vector<int>{});
  EXPECT_EQ(WithStepTimes({1.0, 1.0, 1.2, 1.0}).Stragglers(5),
            std::vector<int>{2});
}

TEST(RankBoard, NeedsThreeRanksWithAStepTimeToNameStragglers) {
  EXPECT_EQ(WithStepTimes({1.0, 5.0}).Stragglers(5), std::vector<int>{});
  EXPECT_EQ(WithStepTimes({1.0, 5.0, 0, 0}).Stragglers(5), std::vector<int>{});
  EXPECT_EQ(WithStepTimes({1.0, 5.0, 1.0}).Stragglers(5), std::vector<int>{1});
}

TEST(RankBoard, StragglerBoundIsMedianPlusKMads) {
  // median 1, deviations {0, .2, .2, 0, 2}: MAD 0.2.
  const RankBoard board = WithStepTimes({1.0, 1.2, 0.8, 1.0, 3.0});
  EXPECT_EQ(board.Stragglers(5), std::vector<int>{4});         // bound 2
  EXPECT_EQ(board.Stragglers(20), std::vector<int>{});         // bound 5
  EXPECT_EQ(board.Stragglers(0.5), (std::vector<int>{1, 4}));  // bound 1.1
}

TEST(RankBoard, NeverNamesAnExitedRankAStraggler) {
  RankBoard board = WithStepTimes({1.0, 1.0, 2.0, 1.0, 3.0});
  board.Exited(2, 0, 0, false);
  EXPECT_EQ(board.Stragglers(5), std::vector<int>{4});
}

TEST(RankBoard, KeepsTheStragglerMarkItIsGiven) {
  RankBoard board = Board();
  board.MarkStraggler(3, true);
  EXPECT_TRUE(View(board, 3).straggler);
  board.MarkStraggler(3, false);
  EXPECT_FALSE(View(board, 3).straggler);
}

}  // namespace
}  // namespace dslaunch::launcher
