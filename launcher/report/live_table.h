// The console's live table: one row per node (or per rank), then a progress
// bar with the ETA when the total number of steps is known. Rendered from the
// RankBoard as whole lines, each narrower than the terminal, so the
// TerminalWriter can erase and redraw it in place. Pure functions.
#pragma once

#include <string>

#include "launcher/report/rank_board.h"

namespace dslaunch::launcher {

struct TableStyle {
  int width = 100;    // terminal columns; every line stays below this
  int max_rows = 20;  // node (or rank) rows at most; the rest summarised
  bool unicode = true;
  bool per_rank = false;  // --console all
};

// Text of the table (lines ending in '\n'), for the board at `now` (its clock).
std::string RenderLiveTable(const RankBoard& board, double now,
                            const TableStyle& style);

// Helpers, exposed for tests.
// "▁▂▃▅▇" of the values scaled between their min and max (ASCII " .:-=+*#"
// when !unicode); `width` characters at most, the newest last.
std::string Sparkline(const std::deque<double>& values, size_t width,
                      bool unicode);
// "51.2k", "1.3M", "950"; "1.2e+12" from a trillion on (bounded width).
std::string HumanCount(double value);
// "3.1G", "512M", "40K" (binary units).
std::string HumanBytes(int64_t bytes);
// "45s", "3m02s", "2h05m", "3d04h"; ">99999d" beyond (and for +inf),
// "0.0s" for negative values and NaN.
std::string HumanDuration(double seconds);

}  // namespace dslaunch::launcher
