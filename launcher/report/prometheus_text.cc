#include "launcher/report/prometheus_text.h"

#include <algorithm>  // max
#include <charconv>   // to_chars
#include <cmath>
#include <optional>
#include <vector>

#include "base/exit_status.h"  // ExitStatusForProcess
#include "base/utf8.h"

namespace dslaunch::launcher {

namespace {

using Value = std::optional<double>;

// One per-rank family: its name, help, type and how a rank's value is read.
struct RankFamily {
  const char* name;
  const char* type;
  const char* help;
  Value (*value)(const RankView&, double now);
};

Value Flag(bool b) { return b ? 1.0 : 0.0; }

template <typename T>
Value Opt(const std::optional<T>& v) {
  return v ? Value(static_cast<double>(*v)) : std::nullopt;
}

Value LastSeenAge(const RankView& r, double now) {
  const double at = r.last_record_at > 0 ? r.last_record_at : r.started_at;
  if (at <= 0) return std::nullopt;
  return std::max(0.0, now - at);
}

using S = RankView::State;

// Written in this order, each family's ranks in rank order.
constexpr RankFamily kRankFamilies[] = {
    {"dslaunch_rank_step", "gauge", "The step of the rank's last record.",
     [](const RankView& r, double) { return Opt(r.step); }},
    {"dslaunch_rank_total_steps", "gauge",
     "The total steps the rank's last record announced.",
     [](const RankView& r, double) { return Opt(r.total_steps); }},
    {"dslaunch_rank_loss", "gauge", "The loss of the rank's last record.",
     [](const RankView& r, double) { return Opt(r.loss); }},
    {"dslaunch_rank_tokens_per_second", "gauge",
     "The tokens per second of the rank's last record.",
     [](const RankView& r, double) { return Opt(r.tokens_per_s); }},
    {"dslaunch_rank_step_seconds", "gauge",
     "Median seconds per step over the rank's recent records.",
     [](const RankView& r, double) {
       return r.step_time_s > 0 ? Value(r.step_time_s) : std::nullopt;
     }},
    {"dslaunch_rank_last_seen_seconds", "gauge",
     "Seconds since the rank's last record (since its start with none).",
     LastSeenAge},
    {"dslaunch_rank_rss_bytes", "gauge",
     "Resident memory of the rank's main process, as its agent last saw it.",
     [](const RankView& r, double) {
       return r.rss_bytes >= 0 ? Value(r.rss_bytes) : std::nullopt;
     }},
    {"dslaunch_rank_gpu_memory_bytes", "gauge",
     "The GPU allocator's peak bytes the rank's last record reported.",
     [](const RankView& r, double) {
       return r.gpu_mem_bytes >= 0 ? Value(r.gpu_mem_bytes) : std::nullopt;
     }},
    {"dslaunch_rank_running", "gauge", "1 while the rank runs.",
     [](const RankView& r, double) { return Flag(r.state == S::kRunning); }},
    {"dslaunch_rank_exited", "gauge", "1 once the rank has exited.",
     [](const RankView& r, double) { return Flag(r.state == S::kExited); }},
    {"dslaunch_rank_exit_code", "gauge",
     "The exited rank's exit status (128 + signal when killed).",
     [](const RankView& r, double) {
       if (r.state != S::kExited) return Value();
       return Value(ExitStatusForProcess(r.exit_code, r.signal));
     }},
    {"dslaunch_rank_oom_killed", "gauge",
     "1 if the kernel's OOM killer ended the rank.",
     [](const RankView& r, double) { return Flag(r.oom_killed); }},
    {"dslaunch_rank_hung", "gauge", "1 while the hang check names the rank.",
     [](const RankView& r, double) { return Flag(r.hung); }},
    {"dslaunch_rank_straggler", "gauge",
     "1 while the straggler check names the rank.",
     [](const RankView& r, double) { return Flag(r.straggler); }},
    {"dslaunch_rank_progress_records_total", "counter",
     "Progress records received from the rank.",
     [](const RankView& r, double) { return Value(r.records); }},
};

void Header(std::string& out, const char* name, const char* type,
            const char* help) {
  out.append("# HELP ").append(name).append(" ").append(help).append("\n");
  out.append("# TYPE ").append(name).append(" ").append(type).append("\n");
}

std::string Labels(const RankView& r) {
  return "{rank=\"" + std::to_string(r.rank) + "\",node=\"" +
         std::to_string(r.node_rank) + "\",host=\"" + EscapeLabelValue(r.host) +
         "\"}";
}

void RenderRankFamily(std::string& out, const RankFamily& family,
                      const RankBoard& board, double now) {
  Header(out, family.name, family.type, family.help);
  for (const auto& [rank, view] : board.ranks()) {
    const Value v = family.value(view, now);
    if (!v) continue;
    out.append(family.name).append(Labels(view)).append(" ");
    out.append(FormatSampleValue(*v)).append("\n");
  }
}

void RenderJobSample(std::string& out, const char* name, const char* type,
                     const char* help, double value) {
  Header(out, name, type, help);
  out.append(name).append(" ").append(FormatSampleValue(value)).append("\n");
}

}  // namespace

std::string EscapeLabelValue(std::string_view value) {
  std::string out;
  out.reserve(value.size());
  for (size_t i = 0; i < value.size();) {
    const char c = value[i];
    const size_t n = base::Utf8SequenceLength(value.substr(i));
    if (n == 0) {
      out.append("\xEF\xBF\xBD");  // U+FFFD
      ++i;
      continue;
    }
    if (c == '\\')
      out.append("\\\\");
    else if (c == '"')
      out.append("\\\"");
    else if (c == '\n')
      out.append("\\n");
    else
      out.append(value.substr(i, n));
    i += n;
  }
  return out;
}

std::string FormatSampleValue(double value) {
  if (std::isnan(value)) return "NaN";
  if (std::isinf(value)) return value > 0 ? "+Inf" : "-Inf";
  char buf[64];
  const auto res = std::to_chars(buf, buf + sizeof(buf), value);
  return std::string(buf, res.ptr);
}

std::string RenderMetrics(const RankBoard& board, const JobCounters& counters,
                          double now) {
  std::string out;
  for (const RankFamily& family : kRankFamilies) {
    RenderRankFamily(out, family, board, now);
  }
  RenderJobSample(out, "dslaunch_restarts_total", "counter",
                  "Elastic restarts of the job.", counters.restarts);
  RenderJobSample(
      out, "dslaunch_progress_records_total", "counter",
      "Progress records received from every rank, malformed ones included.",
      static_cast<double>(counters.progress_records));
  RenderJobSample(out, "dslaunch_malformed_progress_records_total", "counter",
                  "Progress records dropped as malformed.",
                  static_cast<double>(counters.malformed_progress));
  RenderJobSample(out, "dslaunch_console_dropped_lines_total", "counter",
                  "Rank output lines the terminal did not take.",
                  static_cast<double>(counters.dropped_lines));
  RenderJobSample(out, "dslaunch_job_ranks", "gauge", "Ranks in the job.",
                  static_cast<double>(board.ranks().size()));
  RenderJobSample(out, "dslaunch_job_nodes", "gauge", "Nodes in the job.",
                  board.num_nodes());
  if (counters.started_at > 0) {
    RenderJobSample(out, "dslaunch_job_start_time_seconds", "gauge",
                    "When the launcher started the job (unix seconds).",
                    counters.started_at);
  }
  return out;
}

}  // namespace dslaunch::launcher
