#include "launcher/report/live_table.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "base/utf8.h"

namespace dslaunch::launcher {
namespace {

using json = nlohmann::ordered_json;

std::vector<std::string> Lines(const std::string& text) {
  std::vector<std::string> out;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) out.push_back(line);
  return out;
}

// Terminal columns (wide characters count two; tests/base/utf8_test.cc).
size_t Columns(const std::string& s) { return base::DisplayColumns(s); }

bool EndsWith(const std::string& s, const std::string& tail) {
  return s.size() >= tail.size() &&
         s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}

// The line of the table that shows `host` (hosts are unique per plan).
std::string RowOf(const std::string& table, const std::string& host) {
  for (const std::string& line : Lines(table))
    if (line.rfind(" " + host + " ", 0) == 0) return line;
  return "<no row for " + host + ">";
}

// `nodes` hosts of `per_node` ranks each, ranks in blocks.
Plan MakePlan(int nodes, int per_node, const std::string& prefix = "node-") {
  Plan plan;
  for (int n = 0; n < nodes; ++n) {
    NodePlan node;
    node.node_rank = n;
    node.host = prefix + (nodes <= 26 && prefix == "node-"
                              ? std::string(1, static_cast<char>('a' + n))
                              : std::to_string(n));
    for (int i = 0; i < per_node; ++i) node.slots.push_back(i);
    node.first_rank = n * per_node;
    plan.nodes.push_back(node);
  }
  plan.world_size = nodes * per_node;
  return plan;
}

constexpr double kNow = 1015;

// Two nodes of four ranks, all started at 995; two records each (step 10
// at 1000, step 12 at 1010 of 20): 5 s per step, seen 5 s ago at kNow.
// Loss 2 on node-a, 3 on node-b; 1000 tokens/s and 1 GiB per rank.
RankBoard Running(bool total = true) {
  RankBoard board;
  board.Reset(MakePlan(2, 4));
  for (int r = 0; r < 8; ++r) {
    board.Started(r, 100 + r, 995);
    for (const auto& [time, step] : {std::pair{1000.0, 10}, {1010.0, 12}}) {
      json record{{"step", step},
                  {"loss", r < 4 ? 2.0 : 3.0},
                  {"tokens_per_s", 1000.0}};
      if (total) record["total_steps"] = 20;
      board.Record(r, record, time);
    }
    board.Stats(r, int64_t{1} << 30);
  }
  return board;
}

TEST(LiveTable, ShowsARowPerNodeThenTheProgressBar) {
  const std::string text = RenderLiveTable(Running(), kNow, TableStyle{});
  EXPECT_EQ(
      Lines(text),
      (std::vector<std::string>{
          " node    ranks   step    loss      tok/s  seen   mem",
          " node-a  0-3    12/20  2.0000  \u2584\u2584   4000  5.0s  4.0G",
          " node-b  4-7    12/20  3.0000  \u2584\u2584   4000  5.0s  4.0G",
          " [\u2588\u2588\u2588\u2588\u2588\u2588\u2588\u2588\u2588\u2588"
          "\u2588\u2588\u2588\u2588\u2591\u2591\u2591\u2591\u2591\u2591"
          "\u2591\u2591\u2591\u2591] 60%  ETA 40s  8/8 ranks running  "
          "20s elapsed",
      }));
  EXPECT_TRUE(EndsWith(text, "\n"));
}

TEST(LiveTable, ShowsARowPerRankWhenAskedTo) {
  TableStyle style;
  style.per_rank = true;
  const auto lines = Lines(RenderLiveTable(Running(), kNow, style));
  ASSERT_EQ(lines.size(), 1u + 8u + 1u);
  EXPECT_EQ(lines[0], " node    rank   step    loss      tok/s  seen   mem");
  EXPECT_EQ(lines[1],
            " node-a  0     12/20  2.0000  \u2584\u2584   1000  5.0s  1.0G");
  EXPECT_EQ(lines[8],
            " node-b  7     12/20  3.0000  \u2584\u2584   1000  5.0s  1.0G");
}

// A GPU column only when some rank reports its GPU memory: a node's sum,
// "-" for a node without.
TEST(LiveTable, ShowsGpuMemoryOnlyWhereARankReportsIt) {
  RankBoard board = Running();
  for (int r = 0; r < 4; ++r) {
    board.Record(r,
                 json{{"step", 12},
                      {"loss", 2.0},
                      {"tokens_per_s", 1000.0},
                      {"total_steps", 20},
                      {"gpu_mem_bytes", int64_t{3} << 30}},
                 1010);
  }
  const auto lines = Lines(RenderLiveTable(board, kNow, TableStyle{}));
  ASSERT_GE(lines.size(), 3u);
  // (node-a's third record widens the loss sparkline by one.)
  EXPECT_EQ(lines[0],
            " node    ranks   step    loss       tok/s  seen   mem    gpu");
  EXPECT_TRUE(EndsWith(lines[1], "4.0G  12.0G")) << lines[1];
  EXPECT_TRUE(EndsWith(lines[2], "4.0G      -")) << lines[2];
  // Without any, the table is as before.
  EXPECT_EQ(Lines(RenderLiveTable(Running(), kNow, TableStyle{}))[0],
            " node    ranks   step    loss      tok/s  seen   mem");
}

TEST(LiveTable, ShowsTheSlowestStepMeanLossAndSummedTokensOfANode) {
  RankBoard board;
  board.Reset(MakePlan(1, 4));
  for (int r = 0; r < 4; ++r) {
    board.Started(r, 1, 990);
    board.Record(r,
                 json{{"step", 10 + r},
                      {"total_steps", 100},
                      {"loss", 1.0 + r},
                      {"tokens_per_s", 12800.0}},
                 1000 + r);
  }
  const std::string row = RowOf(RenderLiveTable(board, 1010, {}), "node-a");
  // step: the lowest; loss: the mean of 1..4; 51200 tokens/s; seen: oldest.
  EXPECT_EQ(row, " node-a  0-3    10/100  2.5000  \u2584  51.2k   10s    -");
}

TEST(LiveTable, ShowsDashesForWhatIsNotKnown) {
  RankBoard board;
  board.Reset(MakePlan(1, 2));
  board.Started(0, 1, 1000);
  board.Started(1, 1, 1000);
  const auto lines = Lines(RenderLiveTable(board, 1010, {}));
  ASSERT_EQ(lines.size(), 3u);
  EXPECT_EQ(lines[0], " node    ranks  step  loss    tok/s  seen  mem");
  EXPECT_EQ(lines[1], " node-a  0-1       -     -        -     -    -");
  EXPECT_EQ(lines[2], " 2/2 ranks running  10s elapsed");
}

TEST(LiveTable, HasNoBarWithoutTotalSteps) {
  const auto lines = Lines(RenderLiveTable(Running(false), kNow, {}));
  ASSERT_EQ(lines.size(), 4u);
  EXPECT_EQ(lines[1],
            " node-a  0-3      12  2.0000  \u2584\u2584   4000  5.0s  4.0G");
  EXPECT_EQ(lines[3], " 8/8 ranks running  20s elapsed");
}

TEST(LiveTable, HasNoEtaBeforeAStepTimeIsKnown) {
  RankBoard board;
  board.Reset(MakePlan(1, 1));
  board.Started(0, 1, 1000);
  board.Record(0, json{{"step", 5}, {"total_steps", 10}}, 1001);
  const auto lines = Lines(RenderLiveTable(board, 1002, {}));
  EXPECT_EQ(lines.back(),
            " [\u2588\u2588\u2588\u2588\u2588\u2588\u2588\u2588\u2588\u2588"
            "\u2588\u2588\u2591\u2591\u2591\u2591\u2591\u2591\u2591\u2591"
            "\u2591\u2591\u2591\u2591] 50%  1/1 ranks running  2.0s elapsed");
}

TEST(LiveTable, ShowsAFullBarWithoutEtaWhenDone) {
  RankBoard board;
  board.Reset(MakePlan(1, 1));
  board.Started(0, 1, 1000);
  board.Record(0, json{{"step", 0}, {"total_steps", 10}}, 1000);
  board.Record(0, json{{"step", 10}, {"total_steps", 10}}, 1010);
  board.Exited(0, 0, 0, false);
  TableStyle style;
  style.unicode = false;
  const auto lines = Lines(RenderLiveTable(board, 1020, style));
  EXPECT_EQ(lines.back(),
            " [########################] 100%  0/1 ranks running  20s elapsed");
  EXPECT_TRUE(EndsWith(lines[1], "  done")) << lines[1];
}

TEST(LiveTable, NamesTheStateOfARow) {
  RankBoard board;
  board.Reset(MakePlan(8, 1));  // node-a .. node-h, rank r on node r
  for (int r = 0; r < 7; ++r) {
    board.Started(r, 100 + r, 1000);
    board.Record(r, json{{"step", 3}}, 1010);
  }
  board.Exited(0, 0, 0, false);   // node-a
  board.MarkStraggler(1, true);   // node-b
  board.MarkHung(2, true);        // node-c: silent since 1010
  board.Exited(3, 137, 9, true);  // node-d
  board.Exited(4, 3, 0, false);   // node-e
  board.Exited(5, 0, 15, false);  // node-f
  /* rank 6 running: no word */   // node-g
  /* rank 7 never started */      // node-h
  const std::string text = RenderLiveTable(board, 1041, {});
  EXPECT_TRUE(EndsWith(RowOf(text, "node-a"), "  done")) << text;
  EXPECT_TRUE(EndsWith(RowOf(text, "node-b"), "  slow")) << text;
  EXPECT_TRUE(EndsWith(RowOf(text, "node-c"), "  HUNG 31s")) << text;
  EXPECT_TRUE(EndsWith(RowOf(text, "node-d"), "  OOM-killed")) << text;
  EXPECT_TRUE(EndsWith(RowOf(text, "node-e"), "  exit 3")) << text;
  EXPECT_TRUE(EndsWith(RowOf(text, "node-f"), "  signal 15")) << text;
  EXPECT_TRUE(EndsWith(RowOf(text, "node-g"), "  -")) << text;
  EXPECT_TRUE(EndsWith(RowOf(text, "node-h"), "  starting")) << text;
}

TEST(LiveTable, NamesTheWorstStateOfANodesRanks) {
  RankBoard board;
  board.Reset(MakePlan(1, 4));
  for (int r = 0; r < 4; ++r) board.Started(r, 1, 1000);
  board.Exited(0, 0, 0, false);
  board.Exited(2, 3, 0, false);
  const std::string row = RowOf(RenderLiveTable(board, 1001, {}), "node-a");
  EXPECT_TRUE(EndsWith(row, "  exit 3")) << row;
}

TEST(LiveTable, SaysHungSinceTheStartWhenARankNeverReported) {
  RankBoard board;
  board.Reset(MakePlan(1, 1));
  board.Started(0, 1, 1000);
  board.MarkHung(0, true);
  const std::string row = RowOf(RenderLiveTable(board, 1125, {}), "node-a");
  EXPECT_TRUE(EndsWith(row, "  HUNG 2m05s")) << row;
}

TEST(LiveTable, KeepsEveryLineNarrowerThanTheTerminal) {
  RankBoard board = Running();
  board.Exited(5, 137, 9, true);
  board.MarkHung(1, true);
  for (int width : {21, 30, 40, 60, 80, 100, 200}) {
    for (bool per_rank : {false, true}) {
      for (bool unicode : {false, true}) {
        TableStyle style;
        style.width = width;
        style.per_rank = per_rank;
        style.unicode = unicode;
        const std::string text = RenderLiveTable(board, kNow, style);
        for (const std::string& line : Lines(text))
          EXPECT_LT(Columns(line), static_cast<size_t>(width))
              << "width " << width << ": '" << line << "'";
      }
    }
  }
}

TEST(LiveTable, KeepsLinesNarrowerThanAVeryNarrowTerminal) {
  TableStyle style;
  style.width = 12;
  for (const std::string& line : Lines(RenderLiveTable(Running(), kNow, style)))
    EXPECT_LT(Columns(line), 12u) << "'" << line << "'";
}

TEST(LiveTable, CutsALongHostName) {
  Plan plan = MakePlan(1, 2);
  plan.nodes[0].host = std::string(40, 'h');
  RankBoard board;
  board.Reset(plan);
  const auto lines = Lines(RenderLiveTable(board, 1000, {}));
  ASSERT_GE(lines.size(), 2u);
  EXPECT_EQ(lines[1].substr(0, 28), " " + std::string(24, 'h') + "  0");
}

TEST(LiveTable, CountsWideCharactersInHostNamesAsTwoColumns) {
  // 40 CJK characters, 80 columns: cut to the host column's 24 columns,
  // which is 12 of them, and the next column starts where the header's does.
  std::string wide;
  for (int i = 0; i < 40; ++i) wide += "\xE8\xAE\xAD";  // 训
  Plan plan = MakePlan(2, 2);
  plan.nodes[0].host = wide;
  plan.nodes[1].host = "\xE8\xAE\xAD\xE7\xBB\x83-1";  // 训练-1, 6 columns
  RankBoard board;
  board.Reset(plan);
  const auto lines = Lines(RenderLiveTable(board, 1000, {}));
  ASSERT_GE(lines.size(), 3u);
  std::string twelve;
  for (int i = 0; i < 12; ++i) twelve += "\xE8\xAE\xAD";
  EXPECT_EQ(lines[1].substr(0, 1 + twelve.size() + 3), " " + twelve + "  0");
  EXPECT_EQ(Columns(lines[0].substr(0, lines[0].find("ranks"))), 27u);
  EXPECT_EQ(Columns(lines[2].substr(0, lines[2].find("2-3"))), 27u);
  for (int width : {12, 21, 30, 40, 80}) {
    TableStyle style;
    style.width = width;
    for (const std::string& line : Lines(RenderLiveTable(board, 1000, style)))
      EXPECT_LT(Columns(line), static_cast<size_t>(width))
          << "width " << width << ": '" << line << "'";
  }
}

TEST(LiveTable, WritesOnlyAsciiInAsciiMode) {
  RankBoard board = Running();
  board.Record(0, json{{"step", 13}, {"loss", 9.0}}, 1011);
  board.MarkHung(6, true);
  TableStyle style;
  style.unicode = false;
  for (bool per_rank : {false, true}) {
    style.per_rank = per_rank;
    const std::string text = RenderLiveTable(board, kNow, style);
    for (unsigned char c : text) ASSERT_LT(c, 0x80) << text;
    EXPECT_NE(text.find("[##############..........] 60%"), std::string::npos)
        << text;
  }
}

// Six nodes of two ranks, all running with a step; `problems` exited 3.
RankBoard SixNodes(const std::vector<int>& problem_nodes) {
  RankBoard board;
  board.Reset(MakePlan(6, 2));
  for (int r = 0; r < 12; ++r) {
    board.Started(r, 1, 1000);
    board.Record(r, json{{"step", 1}}, 1001);
  }
  for (int node : problem_nodes) board.Exited(node * 2, 3, 0, false);
  return board;
}

std::vector<std::string> Hosts(const std::string& table) {
  std::vector<std::string> hosts;
  for (const std::string& line : Lines(table))
    if (line.rfind(" node-", 0) == 0) hosts.push_back(line.substr(1, 6));
  return hosts;
}

TEST(LiveTable, ShowsAtMostMaxRowsKeepingTheRowsWithAProblem) {
  TableStyle style;
  style.max_rows = 3;
  const std::string text = RenderLiveTable(SixNodes({4}), 1002, style);
  EXPECT_EQ(Hosts(text),
            (std::vector<std::string>{"node-e", "node-a", "node-b"}))
      << text;
  const auto lines = Lines(text);
  ASSERT_EQ(lines.size(), 1u + 3u + 1u + 1u);
  EXPECT_EQ(lines[4], " ... 3 more nodes");
}

TEST(LiveTable, SaysHowManyOfTheRowsLeftOutHaveAProblem) {
  TableStyle style;
  style.max_rows = 2;
  const std::string text = RenderLiveTable(SixNodes({2, 3, 4, 5}), 1002, style);
  EXPECT_EQ(Hosts(text), (std::vector<std::string>{"node-c", "node-d"}))
      << text;
  EXPECT_EQ(Lines(text)[3], " ... 4 more nodes, 2 of them with a problem");
}

TEST(LiveTable, SaysRanksWhenLeavingOutRankRows) {
  TableStyle style;
  style.max_rows = 4;
  style.per_rank = true;
  const auto lines = Lines(RenderLiveTable(SixNodes({}), 1002, style));
  ASSERT_EQ(lines.size(), 1u + 4u + 1u + 1u);
  EXPECT_EQ(lines[5], " ... 8 more ranks");
}

TEST(LiveTable, ShowsEveryRowWhenTheyFit) {
  TableStyle style;
  style.max_rows = 6;
  const std::string text = RenderLiveTable(SixNodes({4}), 1002, style);
  EXPECT_EQ(Hosts(text),
            (std::vector<std::string>{"node-a", "node-b", "node-c", "node-d",
                                      "node-e", "node-f"}));
  EXPECT_EQ(text.find("more"), std::string::npos);
}

TEST(LiveTable, IsEmptyWithoutRanks) {
  EXPECT_EQ(RenderLiveTable(RankBoard{}, 0, {}), "");
}

// A rank's numbers come from the rank: an absurd one must not push the
// state of every row off the screen.
TEST(LiveTable, KeepsTheStateInViewWhenARankReportsAHugeNumber) {
  RankBoard board;
  board.Reset(MakePlan(2, 1));
  board.Started(0, 1, 1000);
  board.Started(1, 1, 1000);
  board.Record(0, json{{"loss", 1e300}, {"tokens_per_s", 1e300}}, 1001);
  board.Record(1, json{{"loss", 1.0}}, 1001);
  board.MarkHung(1, true);
  TableStyle style;
  style.width = 100;
  const std::string text = RenderLiveTable(board, 1032, style);
  EXPECT_NE(RowOf(text, "node-b").find("HUNG 31s"), std::string::npos) << text;
}

// ---- helpers ----

TEST(Sparkline, ScalesBetweenMinAndMax) {
  EXPECT_EQ(Sparkline({0, 1, 2, 3, 4, 5, 6, 7}, 12, true),
            "\u2581\u2582\u2583\u2584\u2585\u2586\u2587\u2588");
  EXPECT_EQ(Sparkline({0, 1, 2, 3, 4, 5, 6, 7}, 12, false), " .:-=+*#");
  EXPECT_EQ(Sparkline({10, -10}, 12, false), "# ");
}

TEST(Sparkline, ShowsTheNewestValuesThatFit) {
  const std::deque<double> values{0, 1, 2, 3, 4, 5, 6, 7, 8, 9};
  EXPECT_EQ(Sparkline(values, 4, true), "\u2581\u2583\u2586\u2588");
  EXPECT_EQ(Sparkline(values, 4, false), " :+#");
  EXPECT_EQ(Columns(Sparkline(values, 3, true)), 3u);
}

TEST(Sparkline, IsMidHeightForEqualValues) {
  EXPECT_EQ(Sparkline({2.5, 2.5, 2.5}, 12, true), "\u2584\u2584\u2584");
  EXPECT_EQ(Sparkline({-1}, 12, false), "-");
}

TEST(Sparkline, IsEmptyForNoValuesOrNoWidth) {
  EXPECT_EQ(Sparkline({}, 12, true), "");
  EXPECT_EQ(Sparkline({1, 2, 3}, 0, true), "");
}

TEST(Sparkline, ScalesExtremeButFiniteValues) {
  const double big = std::numeric_limits<double>::max();
  EXPECT_EQ(Sparkline({-big, big}, 12, false), " #");
  // Scaled as small values are.
  EXPECT_EQ(Sparkline({-big, 0, big}, 12, false),
            Sparkline({-1, 0, 1}, 12, false));
  EXPECT_EQ(Sparkline({-big, 0, big}, 12, false), " -#");
}

TEST(HumanCount, UsesDecimalUnits) {
  EXPECT_EQ(HumanCount(0), "0");
  EXPECT_EQ(HumanCount(950), "950");
  EXPECT_EQ(HumanCount(9999), "9999");
  EXPECT_EQ(HumanCount(10000), "10.0k");
  EXPECT_EQ(HumanCount(51200), "51.2k");
  EXPECT_EQ(HumanCount(1.3e6), "1.3M");
  EXPECT_EQ(HumanCount(2.5e9), "2.5G");
  EXPECT_EQ(HumanCount(999999), "1.0M");
  EXPECT_EQ(HumanCount(1e15), "1e+15");  // bounded width from 1e12 on
}

TEST(HumanCount, KeepsTheSignOfNegativeValues) {
  EXPECT_EQ(HumanCount(-5), "-5");
  EXPECT_EQ(HumanCount(-51200), "-51.2k");
  EXPECT_EQ(HumanCount(-2.5e9), "-2.5G");
}

TEST(HumanCount, ShowsADashForNonFiniteValues) {
  EXPECT_EQ(HumanCount(std::nan("")), "-");
  EXPECT_EQ(HumanCount(std::numeric_limits<double>::infinity()), "-");
  EXPECT_EQ(HumanCount(-std::numeric_limits<double>::infinity()), "-");
}

TEST(HumanBytes, UsesBinaryUnits) {
  EXPECT_EQ(HumanBytes(0), "0K");
  EXPECT_EQ(HumanBytes(1024), "1K");
  EXPECT_EQ(HumanBytes(40 * 1024), "40K");
  EXPECT_EQ(HumanBytes(int64_t{1} << 20), "1M");
  EXPECT_EQ(HumanBytes(int64_t{512} << 20), "512M");
  EXPECT_EQ(HumanBytes(int64_t{1} << 30), "1.0G");
  EXPECT_EQ(HumanBytes(static_cast<int64_t>(3.1 * (1 << 30))), "3.1G");
  EXPECT_EQ(HumanBytes(std::numeric_limits<int64_t>::max()), "8589934592.0G");
  EXPECT_EQ(HumanBytes(-2048), "-2K");
}

TEST(HumanDuration, PicksTwoUnits) {
  EXPECT_EQ(HumanDuration(0), "0.0s");
  EXPECT_EQ(HumanDuration(2.34), "2.3s");
  EXPECT_EQ(HumanDuration(10), "10s");
  EXPECT_EQ(HumanDuration(45), "45s");
  EXPECT_EQ(HumanDuration(59.9), "59s");
  EXPECT_EQ(HumanDuration(60), "1m00s");
  EXPECT_EQ(HumanDuration(182), "3m02s");
  EXPECT_EQ(HumanDuration(3599), "59m59s");
  EXPECT_EQ(HumanDuration(3600), "1h00m");
  EXPECT_EQ(HumanDuration(7500), "2h05m");
  EXPECT_EQ(HumanDuration(86399), "23h59m");
  EXPECT_EQ(HumanDuration(86400), "1d00h");
  EXPECT_EQ(HumanDuration(3 * 86400 + 4 * 3600 + 59), "3d04h");
  EXPECT_EQ(HumanDuration(99999.0 * 86400), "99999d00h");
  EXPECT_EQ(HumanDuration(1e15), ">99999d");
}

TEST(HumanDuration, ShowsZeroForNegativeAndNonFinite) {
  EXPECT_EQ(HumanDuration(-5), "0.0s");
  EXPECT_EQ(HumanDuration(std::nan("")), "0.0s");
  EXPECT_EQ(HumanDuration(std::numeric_limits<double>::infinity()), ">99999d");
  EXPECT_EQ(HumanDuration(-std::numeric_limits<double>::infinity()), "0.0s");
}

// An ETA is step time times steps left, both from the ranks: it can pass
// what an int64_t of seconds holds.
TEST(HumanDuration, SaysBeyondForDurationsBeyondInt64) {
  for (double s : {1e19, 1e30, std::numeric_limits<double>::max()}) {
    EXPECT_EQ(HumanDuration(s), ">99999d") << s;
  }
}

TEST(LiveTable, ShowsAnEtaBeyondInt64SecondsWithoutANegativeNumber) {
  RankBoard board;
  board.Reset(MakePlan(1, 1));
  board.Started(0, 1, 1000);
  board.Record(0, json{{"step", 0}, {"total_steps", 9e15}}, 1000);
  board.Record(0, json{{"step", 1}, {"total_steps", 9e15}}, 2e6);
  const auto lines = Lines(RenderLiveTable(board, 2e6, {}));
  const std::string& bar = lines.back();
  const size_t eta = bar.find("ETA ");
  ASSERT_NE(eta, std::string::npos) << bar;
  EXPECT_NE(bar[eta + 4], '-') << bar;
}

}  // namespace
}  // namespace dslaunch::launcher
