#include "launcher/report/tensorboard_sink.h"

#include <algorithm>  // max
#include <chrono>     // system_clock
#include <utility>

#include "base/unix_time.h"

namespace dslaunch::launcher {
namespace {

constexpr const char* kFlag = "--tensorboard";

// The run `name` in `top`: opened relative to the directory opened at the
// start, never by path (SafeDir::Child: never a link, this user's).
StatusOr<std::unique_ptr<base::EventFileWriter>> OpenRun(
    const base::SafeDir& top, const std::string& name, double wall_time) {
  ASSIGN_OR_RETURN(base::SafeDir run, top.Child(name));
  return base::EventFileWriter::Create(run, wall_time, kFlag);
}

}  // namespace

StatusOr<std::unique_ptr<TensorBoardSink>> TensorBoardSink::Create(
    const std::string& dir, const RankBoard& board) {
  ASSIGN_OR_RETURN(base::SafeDir top, base::SafeDir::Open(dir, kFlag));
  ASSIGN_OR_RETURN(std::unique_ptr<base::EventFileWriter> job,
                   OpenRun(top, "job", base::UnixSeconds()));
  return std::unique_ptr<TensorBoardSink>(
      new TensorBoardSink(std::move(top), board, std::move(job)));
}

TensorBoardSink::TensorBoardSink(base::SafeDir dir, const RankBoard& board,
                                 std::unique_ptr<base::EventFileWriter> job)
    : dir_(std::move(dir)), board_(board), job_(std::move(job)) {}

TensorBoardSink::~TensorBoardSink() { Close(); }

void TensorBoardSink::Keep(const Status& status) {
  if (status_.ok() && !status.ok()) status_ = status;
}

base::EventFileWriter* TensorBoardSink::RankRun(int rank, double wall_time) {
  auto it = ranks_.find(rank);
  if (it != ranks_.end()) return it->second.get();
  auto run = OpenRun(dir_, "rank-" + std::to_string(rank), wall_time);
  Keep(run.status());
  auto& slot = ranks_[rank];
  if (run.ok()) slot = std::move(run).value();
  return slot.get();
}

void TensorBoardSink::Record(
    int rank, int64_t step,
    const std::vector<std::pair<std::string, double>>& scalars,
    double wall_time) {
  if (closed_ || !board_.ranks().count(rank)) return;
  if (!scalars.empty()) {
    if (base::EventFileWriter* run = RankRun(rank, wall_time)) {
      run->AddScalars(step, scalars, wall_time);
      Keep(run->status());
    }
  }
  AddToJob(rank, step, scalars, wall_time);
  auto it = pending_.find(step);
  if (it != pending_.end() && Complete(it->first, it->second, AliveRanks())) {
    WriteJobStep(it->first, it->second);
    pending_.erase(it);
  }
}

void TensorBoardSink::AddToJob(
    int rank, int64_t step,
    const std::vector<std::pair<std::string, double>>& scalars,
    double wall_time) {
  if (written_.count(step)) return;  // already written without this rank
  if (!pending_.count(step) && pending_.size() >= kMaxPendingSteps) {
    WriteJobStep(pending_.begin()->first, pending_.begin()->second);
    pending_.erase(pending_.begin());
  }
  PendingStep& p = pending_[step];
  p.wall_time = std::max(p.wall_time, wall_time);
  uint64_t& taken = p.taken[rank];
  for (const auto& [tag, value] : scalars) {
    size_t i = 0;
    while (i < p.tags.size() && p.tags[i].first != tag) ++i;
    if (i == p.tags.size()) {
      if (p.tags.size() >= kMaxJobTags) continue;
      p.tags.push_back({tag, Sum{}});
    }
    const uint64_t bit = uint64_t{1} << i;
    if (taken & bit) continue;  // the rank's first value counts
    taken |= bit;
    p.tags[i].second.total += value;
    ++p.tags[i].second.count;
  }
}

size_t TensorBoardSink::AliveRanks() const {
  size_t alive = 0;
  for (const auto& [rank, view] : board_.ranks()) {
    alive += view.state != RankView::State::kExited;
  }
  return alive;
}

bool TensorBoardSink::Complete(int64_t step, const PendingStep& pending,
                               size_t alive) const {
  if (pending.taken.size() >= alive) {  // every live rank, the usual case
    bool all = true;
    for (const auto& [rank, view] : board_.ranks()) {
      if (view.state != RankView::State::kExited && !pending.taken.count(rank))
        all = false;
    }
    if (all) return true;
  }
  // Ranks that never report (a script reporting from rank 0 only) do not
  // hold a step back once kReporterLag newer steps came: then the ranks that
  // have reported before are enough.
  if (pending_.empty() || pending_.rbegin()->first - step < kReporterLag)
    return false;
  for (const auto& [rank, view] : board_.ranks()) {
    if (view.state != RankView::State::kExited && view.step &&
        !pending.taken.count(rank))
      return false;
  }
  return true;
}

void TensorBoardSink::WriteComplete() {
  const size_t alive = AliveRanks();
  for (auto it = pending_.begin(); it != pending_.end();) {
    if (!Complete(it->first, it->second, alive)) {
      ++it;
      continue;
    }
    WriteJobStep(it->first, it->second);
    it = pending_.erase(it);
  }
}

void TensorBoardSink::WriteJobStep(int64_t step, const PendingStep& pending) {
  std::vector<std::pair<std::string, double>> values;
  values.reserve(pending.tags.size());
  for (const auto& [tag, sum] : pending.tags) {
    const bool summed = tag == "tokens_per_s";
    values.emplace_back(tag, summed ? sum.total : sum.total / sum.count);
  }
  job_->AddScalars(step, values, pending.wall_time);
  Keep(job_->status());
  if (written_.insert(step).second) written_order_.push_back(step);
  if (written_order_.size() > kWrittenSteps) {
    written_.erase(written_order_.front());
    written_order_.pop_front();
  }
}

void TensorBoardSink::Restart(int restart_count, double wall_time) {
  if (closed_) return;
  for (const auto& [step, pending] : pending_) WriteJobStep(step, pending);
  pending_.clear();
  const int64_t step = written_.empty() ? 0 : *written_.rbegin();
  job_->AddScalar("dslaunch/restarts", step, restart_count, wall_time);
  Keep(job_->status());
}

void TensorBoardSink::Flush() {
  if (closed_) return;
  WriteComplete();
  job_->Flush();
  Keep(job_->status());
  for (auto& [rank, run] : ranks_) {
    if (!run) continue;
    run->Flush();
    Keep(run->status());
  }
}

void TensorBoardSink::Close() {
  if (closed_) return;
  for (const auto& [step, pending] : pending_) WriteJobStep(step, pending);
  pending_.clear();
  job_->Close();
  Keep(job_->status());
  for (auto& [rank, run] : ranks_) {
    if (!run) continue;
    run->Close();
    Keep(run->status());
  }
  closed_ = true;
}

}  // namespace dslaunch::launcher
