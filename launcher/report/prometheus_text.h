// RenderMetrics: the launcher's Prometheus exposition (text format 0.0.4),
// one family per RankView field plus job-level counters, for the metrics
// endpoint (--metrics_port). Pure functions of their arguments; any thread
// (the launcher calls them on its loop, reading the Console's RankBoard).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "launcher/report/rank_board.h"

namespace dslaunch::launcher {

// Job-wide numbers that are not per rank.
struct JobCounters {
  int restarts = 0;                // elastic restarts of the job
  int64_t progress_records = 0;    // records from every rank, malformed too
  int64_t malformed_progress = 0;  // records dropped as malformed
  int64_t dropped_lines = 0;       // output lines the terminal did not take
  double started_at = 0;           // unix seconds; 0: not known (omitted)
};

// Every family has # HELP and # TYPE; a rank with no value for a family
// (no loss yet, rss not known, not exited) is left out of it. Samples are
// labelled rank, node (the node rank) and host. `now` (the board's clock,
// base::SteadySeconds) is what dslaunch_rank_last_seen_seconds measures
// ages against.
std::string RenderMetrics(const RankBoard& board, const JobCounters& counters,
                          double now);

// A label value as the exposition format wants it: backslash, double quote
// and newline escaped; bytes that are not valid UTF-8 become U+FFFD (the
// Prometheus parser rejects them).
std::string EscapeLabelValue(std::string_view value);

// A sample value: integers without a fraction, others in the shortest form
// that reads back the same; NaN, +Inf and -Inf as Prometheus spells them.
std::string FormatSampleValue(double value);

}  // namespace dslaunch::launcher
