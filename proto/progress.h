// The progress protocol: a rank connects to the Unix socket named by
// DSLAUNCH_PROGRESS and writes newline-terminated JSON objects. This file
// holds the record checks (agent side), the annotation the launcher adds
// before writing metrics.jsonl, and a small blocking client for ranks
// written in C++. Pure functions; ProgressClient is single-threaded.
#pragma once

#include <string>
#include <string_view>

#include "proto/status.h"

namespace dslaunch::proto {

inline constexpr size_t kMaxProgressRecordBytes = 64 * 1024;

// OK when `line` is one JSON object of at most kMaxProgressRecordBytes.
Status ValidateProgressRecord(std::string_view line);
// Returns the record with "rank", "node" and "time" set (overwriting any the
// rank sent itself), serialized on one line.
std::string AnnotateProgressRecord(std::string_view json, int rank,
                                   const std::string& node, double time);

class ProgressClient {
 public:
  ProgressClient() = default;
  ~ProgressClient();
  ProgressClient(const ProgressClient&) = delete;
  ProgressClient& operator=(const ProgressClient&) = delete;

  // Connects to `path` (usually getenv("DSLAUNCH_PROGRESS")).
  Status Connect(const std::string& path);
  // Sends one record; `json` must not contain a newline.
  Status Report(std::string_view json);

 private:
  int fd_ = -1;
};

}  // namespace dslaunch::proto
