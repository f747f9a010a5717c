#include "worker/progress_reporter.h"

#include <unistd.h>  // sysconf

#include <cstdio>
#include <cstdlib>
#include <fstream>

namespace dslaunch::worker {

std::string FormatStepReport(const StepReport& r, int64_t rss_bytes) {
  char buf[512];
  std::snprintf(
      buf, sizeof(buf),
      "{\"step\": %lld, \"loss\": %.9g, \"lr\": %.9g, \"grad_norm\": %.9g, "
      "\"tokens_per_s\": %.1f, \"samples_per_s\": %.3f, "
      "\"model_state_bytes\": %lld, \"rss_bytes\": %lld, "
      "\"total_steps\": %lld}",
      static_cast<long long>(r.step), static_cast<double>(r.loss), r.lr,
      static_cast<double>(r.grad_norm), r.tokens_per_s, r.samples_per_s,
      static_cast<long long>(r.model_state_bytes),
      static_cast<long long>(rss_bytes), static_cast<long long>(r.total_steps));
  std::string record = buf;
  // Fields only some runs have, before the closing brace.
  record.pop_back();
  if (r.gpu_mem_bytes >= 0)
    record += ", \"gpu_mem_bytes\": " + std::to_string(r.gpu_mem_bytes);
  if (r.skipped_steps >= 0) {
    char scale[32];
    std::snprintf(scale, sizeof scale, "%.9g", r.loss_scale);
    record += std::string(", \"loss_scale\": ") + scale +
              ", \"skipped_steps\": " + std::to_string(r.skipped_steps);
  }
  return record + "}";
}

int64_t ResidentBytes() {
  std::ifstream statm("/proc/self/statm");
  int64_t size = 0, resident = 0;
  statm >> size >> resident;
  return resident * ::sysconf(_SC_PAGESIZE);
}

ProgressReporter::ProgressReporter() {
  const char* path = std::getenv("DSLAUNCH_PROGRESS");
  connected_ = path && *path && client_.Connect(path).ok();
}

void ProgressReporter::Report(const StepReport& r) {
  if (!connected_) return;
  if (!client_.Report(FormatStepReport(r, ResidentBytes())).ok())
    connected_ = false;
}

}  // namespace dslaunch::worker
