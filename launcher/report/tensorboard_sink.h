// TensorBoardSink: the --tensorboard DIR event files. One run per rank
// (<dir>/rank-<r>, opened at the rank's first record with a step) holds the
// rank's scalars as it sent them; the run <dir>/job holds each step's
// job-wide values once every rank still alive has reported it. Owned by the
// Console next to the RankBoard it reads; main thread only. Write errors are
// kept in status(): the job goes on, and one that succeeds exits 74 as with
// an unwritable log file.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "base/safe_files.h"
#include "base/status.h"
#include "base/tb_events.h"
#include "launcher/report/progress_sink.h"
#include "launcher/report/rank_board.h"

namespace dslaunch::launcher {

class TensorBoardSink : public ProgressSink {
 public:
  // Steps waiting for ranks: past this many, the oldest is written with the
  // ranks it has.
  static constexpr size_t kMaxPendingSteps = 64;
  // Tags of one job-wide step; a rank's further tags are left out of it.
  static constexpr size_t kMaxJobTags = 64;
  // Steps remembered as written, so a rank reporting one late does not
  // write it again.
  static constexpr size_t kWrittenSteps = 256;
  // Steps after which ranks that never reported a step stop holding one.
  static constexpr int64_t kReporterLag = 8;

  // One run per rank (<dir>/rank-<r>) and one job-wide (<dir>/job). Opens
  // <dir> now by SafeDir's rule (base/safe_files.h), making it if missing,
  // and the job run in it: an error names --tensorboard and the path. Runs
  // are made relative to the directory opened now, never by path again.
  // `board` must outlive the sink.
  static StatusOr<std::unique_ptr<TensorBoardSink>> Create(
      const std::string& dir, const RankBoard& board);
  ~TensorBoardSink() override;  // Close()
  TensorBoardSink(const TensorBoardSink&) = delete;
  TensorBoardSink& operator=(const TensorBoardSink&) = delete;

  // A rank's record: its step and numeric fields (RankView::scalars of
  // launcher/report/rank_board.h); the caller passes only records that
  // have a step. Ranks the board does not know are ignored. A record with
  // no scalars still counts as the rank's report of the step. The job run takes
  // "loss" as the mean over ranks, "tokens_per_s" as the sum, any other tag as
  // the mean over the ranks that sent it; a rank's first value of a tag at a
  // step counts.
  void Record(int rank, int64_t step,
              const std::vector<std::pair<std::string, double>>& scalars,
              double wall_time) override;
  // The failed generation's pending steps are written with what they have
  // (its ranks will not report them), and the job run gets
  // "dslaunch/restarts" at the last step written. The restarted ranks go on
  // from their checkpoint's step: steps the job run already holds are not
  // written again (the rank runs have every record).
  void Restart(int restart_count, double wall_time) override;
  // Writes the steps that exits made complete, then flushes every run.
  void Flush() override;
  // Writes every pending step with what it has, then closes every run.
  void Close() override;
  // The first error, OK when none.
  const Status& status() const override { return status_; }

 private:
  struct Sum {
    double total = 0;
    int count = 0;
  };
  // One job-wide step being gathered: at most kMaxJobTags tags, and per
  // rank that reported it a bit per tag it counted.
  struct PendingStep {
    std::vector<std::pair<std::string, Sum>> tags;  // in the order first seen
    std::map<int, uint64_t> taken;                  // rank -> bits of tags
    double wall_time = 0;                           // the latest record's
  };

  TensorBoardSink(base::SafeDir dir, const RankBoard& board,
                  std::unique_ptr<base::EventFileWriter> job);
  base::EventFileWriter* RankRun(int rank, double wall_time);
  void AddToJob(int rank, int64_t step,
                const std::vector<std::pair<std::string, double>>& scalars,
                double wall_time);
  size_t AliveRanks() const;  // ranks of the board not exited
  // Every rank not exited has reported the step; `alive`: AliveRanks().
  bool Complete(int64_t step, const PendingStep& pending, size_t alive) const;
  void WriteComplete();
  void WriteJobStep(int64_t step, const PendingStep& pending);
  void Keep(const Status& status);

  base::SafeDir dir_;  // --tensorboard, opened once; runs are made in it
  const RankBoard& board_;
  std::unique_ptr<base::EventFileWriter> job_;
  // A null writer: the run could not be created (not tried again).
  std::map<int, std::unique_ptr<base::EventFileWriter>> ranks_;
  std::map<int64_t, PendingStep> pending_;
  std::set<int64_t> written_;
  std::deque<int64_t> written_order_;  // oldest first, for the bound
  bool closed_ = false;
  Status status_;
};

}  // namespace dslaunch::launcher
