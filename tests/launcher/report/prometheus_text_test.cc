#include "launcher/report/prometheus_text.h"

#include <gtest/gtest.h>

#include <limits>
#include <nlohmann/json.hpp>
#include <string>

namespace dslaunch::launcher {
namespace {

// Node 0 ("node-a") runs ranks 0 and 1, node 1 (a hostile host) rank 2.
RankBoard ThreeRankBoard(const std::string& host_b = "node-b") {
  Plan plan;
  plan.nodes.push_back(NodePlan{0, "node-a", {0, 1}, 0, {}, {}});
  plan.nodes.push_back(NodePlan{1, host_b, {0}, 2, {}, {}});
  plan.world_size = 3;
  RankBoard board;
  board.Reset(plan);
  return board;
}

nlohmann::ordered_json Rec(int64_t step, double loss) {
  return {{"step", step},
          {"loss", loss},
          {"tokens_per_s", 1500},
          {"total_steps", 100}};
}

bool Has(const std::string& text, const std::string& what) {
  return text.find(what) != std::string::npos;
}

TEST(PrometheusText, EveryFamilyHasHelpAndType) {
  const std::string text = RenderMetrics(ThreeRankBoard(), {}, 100);
  for (const char* family : {"dslaunch_rank_step",
                             "dslaunch_rank_total_steps",
                             "dslaunch_rank_loss",
                             "dslaunch_rank_tokens_per_second",
                             "dslaunch_rank_step_seconds",
                             "dslaunch_rank_last_seen_seconds",
                             "dslaunch_rank_rss_bytes",
                             "dslaunch_rank_gpu_memory_bytes",
                             "dslaunch_rank_running",
                             "dslaunch_rank_exited",
                             "dslaunch_rank_exit_code",
                             "dslaunch_rank_oom_killed",
                             "dslaunch_rank_hung",
                             "dslaunch_rank_straggler",
                             "dslaunch_rank_progress_records_total",
                             "dslaunch_restarts_total",
                             "dslaunch_progress_records_total",
                             "dslaunch_malformed_progress_records_total",
                             "dslaunch_console_dropped_lines_total",
                             "dslaunch_job_ranks",
                             "dslaunch_job_nodes"}) {
    EXPECT_TRUE(Has(text, std::string("# HELP ") + family + " ")) << family;
    EXPECT_TRUE(Has(text, std::string("# TYPE ") + family + " ")) << family;
  }
  EXPECT_TRUE(Has(text, "# TYPE dslaunch_rank_progress_records_total counter"));
  EXPECT_TRUE(Has(text, "# TYPE dslaunch_rank_step gauge"));
  EXPECT_EQ(text.back(), '\n');
}

TEST(PrometheusText, RanksWithoutAValueAreLeftOut) {
  RankBoard board = ThreeRankBoard();
  board.Started(0, 100, 10);
  board.Record(0, Rec(7, 2.5), 20);
  const std::string text = RenderMetrics(board, {}, 25);
  EXPECT_TRUE(Has(text,
                  "dslaunch_rank_step{rank=\"0\",node=\"0\",host=\"node-a\"} "
                  "7\n"));
  EXPECT_FALSE(Has(text, "dslaunch_rank_step{rank=\"1\""));
  EXPECT_TRUE(Has(text,
                  "dslaunch_rank_loss{rank=\"0\",node=\"0\",host=\"node-"
                  "a\"} 2.5\n"));
  EXPECT_TRUE(Has(text,
                  "dslaunch_rank_tokens_per_second{rank=\"0\",node=\"0\","
                  "host=\"node-a\"} 1500\n"));
  EXPECT_TRUE(Has(text,
                  "dslaunch_rank_total_steps{rank=\"0\",node=\"0\","
                  "host=\"node-a\"} 100\n"));
  // Not known yet: rss, step time, exit code.
  EXPECT_FALSE(Has(text, "dslaunch_rank_rss_bytes{"));
  EXPECT_FALSE(Has(text, "dslaunch_rank_gpu_memory_bytes{"));
  EXPECT_FALSE(Has(text, "dslaunch_rank_step_seconds{"));
  EXPECT_FALSE(Has(text, "dslaunch_rank_exit_code{"));
  // Flags are there for every rank.
  EXPECT_TRUE(Has(text,
                  "dslaunch_rank_running{rank=\"0\",node=\"0\",host=\""
                  "node-a\"} 1\n"));
  EXPECT_TRUE(Has(text,
                  "dslaunch_rank_running{rank=\"2\",node=\"1\",host=\""
                  "node-b\"} 0\n"));
}

TEST(PrometheusText, LastSeenIsTheAgeOfTheLastRecordOrOfTheStart) {
  RankBoard board = ThreeRankBoard();
  board.Started(0, 100, 10);
  board.Started(1, 101, 12);
  board.Record(0, Rec(1, 1), 20);
  const std::string text = RenderMetrics(board, {}, 25.5);
  EXPECT_TRUE(Has(text,
                  "dslaunch_rank_last_seen_seconds{rank=\"0\",node=\"0\","
                  "host=\"node-a\"} 5.5\n"));
  EXPECT_TRUE(Has(text,
                  "dslaunch_rank_last_seen_seconds{rank=\"1\",node=\"0\","
                  "host=\"node-a\"} 13.5\n"));
  EXPECT_FALSE(Has(text, "dslaunch_rank_last_seen_seconds{rank=\"2\""));
}

TEST(PrometheusText, ExitsStepTimesAndResources) {
  RankBoard board = ThreeRankBoard();
  board.Started(0, 100, 10);
  board.Started(1, 101, 10);
  board.Record(0, Rec(1, 1), 11);
  board.Record(0, Rec(2, 1), 11.5);
  board.Stats(0, 1 << 20);
  auto gpu = Rec(2, 1);
  gpu["gpu_mem_bytes"] = int64_t{5} << 30;
  board.Record(1, gpu, 11.5);
  board.Exited(1, 3, 0, false);
  board.Exited(2, 0, 9, true);
  board.MarkHung(0, true);
  const std::string text = RenderMetrics(board, {}, 12);
  const std::string r0 = "{rank=\"0\",node=\"0\",host=\"node-a\"} ";
  const std::string r1 = "{rank=\"1\",node=\"0\",host=\"node-a\"} ";
  const std::string r2 = "{rank=\"2\",node=\"1\",host=\"node-b\"} ";
  EXPECT_TRUE(Has(text, "dslaunch_rank_step_seconds" + r0 + "0.5\n"));
  EXPECT_TRUE(Has(text, "dslaunch_rank_rss_bytes" + r0 + "1048576\n"));
  EXPECT_TRUE(
      Has(text, "dslaunch_rank_gpu_memory_bytes" + r1 + "5368709120\n"));
  EXPECT_FALSE(Has(text, "dslaunch_rank_gpu_memory_bytes" + r0));
  EXPECT_TRUE(Has(text, "dslaunch_rank_hung" + r0 + "1\n"));
  EXPECT_TRUE(Has(text, "dslaunch_rank_exit_code" + r1 + "3\n"));
  EXPECT_TRUE(Has(text, "dslaunch_rank_exit_code" + r2 + "137\n"));
  EXPECT_TRUE(Has(text, "dslaunch_rank_oom_killed" + r2 + "1\n"));
  EXPECT_TRUE(Has(text, "dslaunch_rank_exited" + r1 + "1\n"));
  EXPECT_TRUE(Has(text, "dslaunch_rank_running" + r1 + "0\n"));
  EXPECT_FALSE(Has(text, "dslaunch_rank_exit_code" + r0));
  EXPECT_TRUE(Has(text, "dslaunch_rank_progress_records_total" + r0 + "2\n"));
}

TEST(PrometheusText, JobCounters) {
  JobCounters counters;
  counters.restarts = 2;
  counters.progress_records = 40;
  counters.malformed_progress = 3;
  counters.dropped_lines = 9;
  counters.started_at = 1700000000.25;
  const std::string text = RenderMetrics(ThreeRankBoard(), counters, 0);
  EXPECT_TRUE(Has(text, "\ndslaunch_restarts_total 2\n"));
  EXPECT_TRUE(Has(text, "\ndslaunch_progress_records_total 40\n"));
  EXPECT_TRUE(Has(text, "\ndslaunch_malformed_progress_records_total 3\n"));
  EXPECT_TRUE(Has(text, "\ndslaunch_console_dropped_lines_total 9\n"));
  EXPECT_TRUE(Has(text, "\ndslaunch_job_ranks 3\n"));
  EXPECT_TRUE(Has(text, "\ndslaunch_job_nodes 2\n"));
  EXPECT_TRUE(Has(text, "\ndslaunch_job_start_time_seconds 1700000000.25\n"));
}

TEST(PrometheusText, HostileHostsAreEscaped) {
  const std::string hostile = "a\"b\\c\nd} 1\n# x\xff";
  const std::string text = RenderMetrics(ThreeRankBoard(hostile), {}, 0);
  EXPECT_TRUE(Has(text, "host=\"a\\\"b\\\\c\\nd} 1\\n# x\xEF\xBF\xBD\"}"));
  // No line but comments and samples: the hostile newline did not split one.
  size_t start = 0;
  while (start < text.size()) {
    const size_t end = text.find('\n', start);
    const std::string line = text.substr(start, end - start);
    EXPECT_TRUE(line.rfind("dslaunch_", 0) == 0 || line.rfind("# ", 0) == 0)
        << line;
    start = end + 1;
  }
}

TEST(PrometheusText, EscapeLabelValueKeepsValidUtf8) {
  EXPECT_EQ(EscapeLabelValue("h\xC3\xA9te-\xE2\x82\xAC"),
            "h\xC3\xA9te-\xE2\x82\xAC");
  EXPECT_EQ(EscapeLabelValue("\xC0\xAF"),
            "\xEF\xBF\xBD\xEF\xBF\xBD");  // overlong
  EXPECT_EQ(EscapeLabelValue("\xE2\x82"), "\xEF\xBF\xBD\xEF\xBF\xBD");  // cut
  EXPECT_EQ(EscapeLabelValue("tab\there"), "tab\there");
}

TEST(PrometheusText, SampleValues) {
  EXPECT_EQ(FormatSampleValue(3), "3");
  EXPECT_EQ(FormatSampleValue(0.1), "0.1");
  EXPECT_EQ(FormatSampleValue(-2.5), "-2.5");
  EXPECT_EQ(FormatSampleValue(1e300), "1e+300");
  EXPECT_EQ(FormatSampleValue(std::numeric_limits<double>::quiet_NaN()), "NaN");
  EXPECT_EQ(FormatSampleValue(std::numeric_limits<double>::infinity()), "+Inf");
  EXPECT_EQ(FormatSampleValue(-std::numeric_limits<double>::infinity()),
            "-Inf");
}

}  // namespace
}  // namespace dslaunch::launcher
