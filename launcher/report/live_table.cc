#include "launcher/report/live_table.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <vector>

#include "base/host_info.h"  // CpuListString
#include "base/utf8.h"

namespace dslaunch::launcher {

namespace {

using State = RankView::State;

std::string Format(const char* fmt, double v) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), fmt, v);
  return buf;
}

// "2.3145", or "1.2e+300" where fixed notation would be wide.
std::string Loss(double v) {
  return std::isfinite(v) && std::fabs(v) < 1e5 ? Format("%.4f", v)
                                                : Format("%.4g", v);
}

// One row: the ranks it covers, summarised.
struct Row {
  std::vector<const RankView*> ranks;
  bool problem = false;
  std::vector<std::string> cells;
};

std::string StateOf(const std::vector<const RankView*>& ranks, double now) {
  bool all_done = true, any_pending = false, slow = false;
  for (const RankView* r : ranks) {
    if (r->hung) {
      const double since =
          r->last_record_at > 0 ? r->last_record_at : r->started_at;
      return "HUNG " + HumanDuration(now - since);
    }
    if (r->oom_killed) return "OOM-killed";
    if (r->state == State::kExited && (r->exit_code != 0 || r->signal != 0))
      return r->signal ? "signal " + std::to_string(r->signal)
                       : "exit " + std::to_string(r->exit_code);
    all_done = all_done && r->state == State::kExited;
    any_pending = any_pending || r->state == State::kPending;
    slow = slow || r->straggler;
  }
  if (all_done) return "done";
  if (slow) return "slow";
  return any_pending ? "starting" : "";
}

void FillCells(Row& row, double now, bool unicode, int64_t total) {
  std::vector<int> numbers;
  std::optional<int64_t> step;
  double loss_sum = 0, tokens = 0, age = -1;
  int losses = 0;
  int64_t rss = 0, gpu = 0;
  bool any_rss = false, any_tokens = false, any_gpu = false;
  const std::deque<double>* history = nullptr;
  for (const RankView* r : row.ranks) {
    numbers.push_back(r->rank);
    if (r->step) step = step ? std::min(*step, *r->step) : *r->step;
    if (r->loss) loss_sum += *r->loss, ++losses;
    if (r->tokens_per_s) tokens += *r->tokens_per_s, any_tokens = true;
    if (r->rss_bytes >= 0) rss += r->rss_bytes, any_rss = true;
    if (r->gpu_mem_bytes >= 0) gpu += r->gpu_mem_bytes, any_gpu = true;
    if (r->state == State::kRunning && r->last_record_at > 0)
      age = std::max(age, now - r->last_record_at);
    if (!history && !r->loss_history.empty()) history = &r->loss_history;
  }
  const RankView& first = *row.ranks.front();
  std::string step_text = step ? std::to_string(*step) : "-";
  if (step && total > 0) step_text += "/" + std::to_string(total);
  const std::string state = StateOf(row.ranks, now);
  row.problem = !state.empty() && state != "done" && state != "starting";
  row.cells = {first.host,
               base::CpuListString(numbers),
               step_text,
               losses ? Loss(loss_sum / losses) : "-",
               history ? Sparkline(*history, 12, unicode) : "",
               any_tokens ? HumanCount(tokens) : "-",
               age >= 0 ? HumanDuration(age) : "-",
               any_rss ? HumanBytes(rss) : "-",
               any_gpu ? HumanBytes(gpu) : "-",
               state};
}

std::vector<Row> MakeRows(const RankBoard& board, bool per_rank) {
  std::vector<Row> rows;
  int node = -1;
  for (const auto& [rank, view] : board.ranks()) {
    if (per_rank || rows.empty() || view.node_rank != node) rows.emplace_back();
    rows.back().ranks.push_back(&view);
    node = view.node_rank;
  }
  return rows;
}

// The rows that fit: those with a problem first, then in order. Returns
// the line about the rows left out ("" when none).
std::string Fit(std::vector<Row>& rows, size_t max_rows, bool per_rank) {
  if (rows.size() <= max_rows) return "";
  std::stable_partition(rows.begin(), rows.end(),
                        [](const Row& r) { return r.problem; });
  const size_t hidden = rows.size() - max_rows;
  const auto problems = std::count_if(rows.begin() + max_rows, rows.end(),
                                      [](const Row& r) { return r.problem; });
  rows.resize(max_rows);
  std::string out = " ... " + std::to_string(hidden) + " more " +
                    (per_rank ? "ranks" : "nodes");
  return out +
         (problems ? ", " + std::to_string(problems) + " of them with a problem"
                   : "");
}

std::string Bar(const RankBoard& board, double now, const TableStyle& style,
                int64_t total) {
  std::optional<int64_t> step;
  int running = 0, started = 0;
  double start = 0;
  for (const auto& [rank, r] : board.ranks()) {
    if (r.state == State::kRunning) ++running;
    if (r.started_at > 0) {
      ++started;
      start = start == 0 ? r.started_at : std::min(start, r.started_at);
    }
    if (r.step) step = step ? std::min(*step, *r.step) : *r.step;
  }
  std::string tail = "  " + std::to_string(running) + "/" +
                     std::to_string(board.ranks().size()) + " ranks running";
  if (board.restarts() > 0)
    tail += "  restart " + std::to_string(board.restarts());
  if (start > 0) tail += "  " + HumanDuration(now - start) + " elapsed";
  if (total <= 0 || !step) return tail.substr(2);
  const double done = std::clamp(double(*step) / double(total), 0.0, 1.0);
  const int cells = 24;
  const int filled = static_cast<int>(done * cells);
  std::string bar = "[";
  for (int i = 0; i < cells; ++i)
    bar += i < filled ? (style.unicode ? "\u2588" : "#")
                      : (style.unicode ? "\u2591" : ".");
  bar += "] " + Format("%.0f%%", done * 100);
  const double per_step = board.MedianStepTime();
  if (per_step > 0 && *step < total)
    bar += "  ETA " + HumanDuration(per_step * double(total - *step));
  return bar + tail;
}

}  // namespace

std::string Sparkline(const std::deque<double>& values, size_t width,
                      bool unicode) {
  static const char* kBlocks[] = {"\u2581", "\u2582", "\u2583", "\u2584",
                                  "\u2585", "\u2586", "\u2587", "\u2588"};
  static const char kAscii[] = " .:-=+*#";
  const size_t n = std::min(values.size(), width);
  if (n == 0) return "";
  auto begin = values.end() - static_cast<std::ptrdiff_t>(n);
  const auto [lo, hi] = std::minmax_element(begin, values.end());
  std::string out;
  // Halves: hi - lo of finite values may overflow; their halves cannot.
  const double span = *hi / 2 - *lo / 2;
  for (auto it = begin; it != values.end(); ++it) {
    const double at = span > 0 ? (*it / 2 - *lo / 2) / span * 7.999 : 3;
    const int level =
        std::isfinite(at) ? std::clamp(static_cast<int>(at), 0, 7) : 3;
    if (unicode) {
      out += kBlocks[level];
    } else {
      out += kAscii[level];
    }
  }
  return out;
}

std::string HumanCount(double v) {
  if (!std::isfinite(v)) return "-";
  const double a = std::fabs(v);
  if (a >= 999.95e9) return Format("%.3g", v);  // 1.2e+12: bounded width
  if (a >= 999.95e6) return Format("%.1fG", v / 1e9);
  if (a >= 999.95e3) return Format("%.1fM", v / 1e6);
  if (a >= 1e4) return Format("%.1fk", v / 1e3);
  return Format("%.0f", v);
}

std::string HumanBytes(int64_t bytes) {
  const double b = static_cast<double>(bytes);
  if (b >= 1024.0 * 1024 * 1024) return Format("%.1fG", b / (1 << 30));
  if (b >= 1024.0 * 1024) return Format("%.0fM", b / (1 << 20));
  return Format("%.0fK", b / 1024);
}

std::string HumanDuration(double s) {
  if (std::isnan(s) || s < 0) s = 0;
  if (s >= 1e5 * 86400) return ">99999d";  // (and int64 never overflows)
  const auto t = static_cast<int64_t>(s);
  char buf[32];
  if (s < 10) {
    std::snprintf(buf, sizeof(buf), "%.1fs", s);
  } else if (t < 60) {
    std::snprintf(buf, sizeof(buf), "%llds", static_cast<long long>(t));
  } else if (t < 3600) {
    std::snprintf(buf, sizeof(buf), "%lldm%02llds",
                  static_cast<long long>(t / 60),
                  static_cast<long long>(t % 60));
  } else if (t < 86400) {
    std::snprintf(buf, sizeof(buf), "%lldh%02lldm",
                  static_cast<long long>(t / 3600),
                  static_cast<long long>(t / 60 % 60));
  } else {
    std::snprintf(buf, sizeof(buf), "%lldd%02lldh",
                  static_cast<long long>(t / 86400),
                  static_cast<long long>(t / 3600 % 24));
  }
  return buf;
}

std::string RenderLiveTable(const RankBoard& board, double now,
                            const TableStyle& style) {
  if (board.ranks().empty()) return "";
  int64_t total = 0;
  for (const auto& [rank, r] : board.ranks())
    total = std::max<int64_t>(total, r.total_steps.value_or(0));
  std::vector<Row> rows = MakeRows(board, style.per_rank);
  for (Row& row : rows) FillCells(row, now, style.unicode, total);
  const std::string more = Fit(
      rows, static_cast<size_t>(std::max(1, style.max_rows)), style.per_rank);
  std::vector<std::string> head = {"node", style.per_rank ? "rank" : "ranks",
                                   "step", "loss",
                                   "",     "tok/s",
                                   "seen", "mem",
                                   "gpu",  ""};
  // No rank's value may push the state column out of view.
  std::vector<size_t> max_widths = {24, 16, 24, 12, 12, 10, 8, 8, 8, 16};
  std::vector<bool> right = {false, false, true, true, false,
                             true,  true,  true, true, false};
  // The GPU memory column only where some rank trains on a GPU.
  constexpr size_t kGpuColumn = 8;
  const bool gpu = std::any_of(
      board.ranks().begin(), board.ranks().end(),
      [](const auto& entry) { return entry.second.gpu_mem_bytes >= 0; });
  if (!gpu) {
    head.erase(head.begin() + kGpuColumn);
    max_widths.erase(max_widths.begin() + kGpuColumn);
    right.erase(right.begin() + kGpuColumn);
    for (Row& row : rows) row.cells.erase(row.cells.begin() + kGpuColumn);
  }
  std::vector<size_t> widths(head.size());
  for (size_t c = 0; c < head.size(); ++c)
    widths[c] = base::DisplayColumns(head[c]);
  for (const Row& row : rows) {
    for (size_t c = 0; c < row.cells.size(); ++c)
      widths[c] = std::max(widths[c], base::DisplayColumns(row.cells[c]));
  }
  for (size_t c = 0; c < widths.size(); ++c)
    widths[c] = std::min(widths[c], max_widths[c]);
  const size_t limit = static_cast<size_t>(std::max(1, style.width - 1));
  auto line = [&](const std::vector<std::string>& cells) {
    std::string out;
    for (size_t c = 0; c < cells.size(); ++c) {
      std::string cell = base::CutToColumns(cells[c], widths[c]);
      const std::string pad(widths[c] - base::DisplayColumns(cell), ' ');
      out += (c ? "  " : " ") + (right[c] ? pad + cell : cell + pad);
    }
    while (!out.empty() && out.back() == ' ') out.pop_back();
    return base::CutToColumns(out, limit) + "\n";
  };
  std::string text = line(head);
  for (const Row& row : rows) text += line(row.cells);
  if (!more.empty()) text += base::CutToColumns(more, limit) + "\n";
  return text + base::CutToColumns(" " + Bar(board, now, style, total), limit) +
         "\n";
}

}  // namespace dslaunch::launcher
