// ProgressSink: somewhere besides the terminal and metrics.jsonl that the
// Console hands every progress record with a step (TensorBoardSink). The
// Console owns it; main thread only. Write errors are kept in status(): the
// job goes on, and one that succeeds exits 74 as with an unwritable log.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "base/status.h"

namespace dslaunch::launcher {

class ProgressSink {
 public:
  virtual ~ProgressSink() = default;
  // A rank's record: its step and numeric fields (RankView::scalars).
  virtual void Record(
      int rank, int64_t step,
      const std::vector<std::pair<std::string, double>>& scalars,
      double wall_time) = 0;
  // The job restarted (--max_restarts): `restart_count` generations so far.
  virtual void Restart(int restart_count, double wall_time) = 0;
  virtual void Flush() = 0;  // about once a second
  virtual void Close() = 0;  // at the end; nothing is written after
  virtual const Status& status() const = 0;  // the first error, OK if none
};

}  // namespace dslaunch::launcher
