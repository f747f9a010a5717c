#include "launcher/console.h"

#include <cerrno>
#include <filesystem>
#include <nlohmann/json.hpp>  // rank 0's progress line

#include "proto/progress.h"

namespace dslaunch::launcher {

Console::~Console() {
  Flush();
  for (auto& [rank, f] : logs_) std::fclose(f);
  if (metrics_) std::fclose(metrics_);
}

Status Console::Open(const Plan& plan, const std::string& log_dir) {
  for (const auto& node : plan.nodes) {
    for (size_t i = 0; i < node.slots.size(); ++i) {
      const int rank = node.first_rank + static_cast<int>(i);
      prefix_[rank] = "[" + node.host + ":" + std::to_string(rank) + "] ";
      host_[rank] = node.host;
    }
  }
  if (log_dir.empty()) return Status::Ok();
  std::error_code ec;
  std::filesystem::create_directories(log_dir, ec);
  if (ec) return InvalidArgument("--log_dir " + log_dir + ": " + ec.message());
  for (const auto& [rank, prefix] : prefix_) {
    const std::string path = log_dir + "/rank-" + std::to_string(rank) + ".log";
    FILE* f = std::fopen(path.c_str(), "w");
    if (!f) return ErrnoStatus("cannot write " + path, errno);
    logs_[rank] = f;
  }
  const std::string metrics = log_dir + "/metrics.jsonl";
  metrics_ = std::fopen(metrics.c_str(), "w");
  if (!metrics_) return ErrnoStatus("cannot write " + metrics, errno);
  return Status::Ok();
}

void Console::Line(int rank, bool is_stderr, std::string_view line,
                   bool partial) {
  std::string text = prefix_[rank];
  text.append(line);
  text.push_back('\n');
  terminal_.Write(is_stderr ? err_ : out_, std::move(text));
  if (auto it = logs_.find(rank); it != logs_.end()) {
    std::fwrite(line.data(), 1, line.size(), it->second);
    if (!partial) std::fputc('\n', it->second);
  }
  auto& last = last_[rank];
  last.emplace_back(line);
  if (last.size() > kKeptLines) last.pop_front();
}

static std::string ProgressSummary(std::string_view json) {
  auto record = nlohmann::ordered_json::parse(json, nullptr, false);
  std::string out;
  for (auto& [key, value] : record.items()) {
    if (!out.empty()) out += "  ";
    out += key + " " +
           (value.is_string() ? value.get<std::string>() : value.dump());
  }
  return out;
}

void Console::Progress(int rank, std::string_view json, double time) {
  ++progress_records_;
  if (metrics_) {
    std::string line =
        proto::AnnotateProgressRecord(json, rank, host_[rank], time);
    line.push_back('\n');
    std::fwrite(line.data(), 1, line.size(), metrics_);
  }
  if (rank == 0) {
    std::string text =
        "[" + host_[rank] + ":0 progress] " + ProgressSummary(json) + "\n";
    terminal_.Write(err_, std::move(text));
  }
}

void Console::Note(std::string_view message) {
  std::string text = "dslaunch: ";
  text.append(message);
  text.push_back('\n');
  terminal_.Write(err_, std::move(text));
}

void Console::Relay(std::string_view line) {
  std::string text(line);
  text.push_back('\n');
  terminal_.Write(err_, std::move(text));
}

void Console::Flush() {
  // Log files here; the terminal flushes on its own thread.
  for (auto& [rank, f] : logs_) std::fflush(f);
  if (metrics_) std::fflush(metrics_);
}

}  // namespace dslaunch::launcher
