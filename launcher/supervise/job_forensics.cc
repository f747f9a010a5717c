// JobForensics (job_forensics.h): stacks, OOM kills and error files.
#include "launcher/supervise/job_forensics.h"

#include <spdlog/spdlog.h>

#include <algorithm>

#include "launcher/report/log_files.h"  // SinkFile
#include "proto/progress.h"             // EscapeControlChars

namespace dslaunch::launcher {

namespace {

constexpr size_t kMaxStacksBytes = 256u << 10;  // per rank, as the agent's
constexpr size_t kMaxStackRanks = 64;           // ranks whose stacks are kept
constexpr size_t kMaxErrorFileBytes = 64u << 10;
constexpr size_t kMaxErrorFileRanks = 64;  // ranks whose error files are kept
constexpr size_t kStackLinesShown = 12;
// An agent answers each rank's request within 20 s (StackToolOptions).
constexpr auto kStacksWait = std::chrono::seconds(25);

}  // namespace

JobForensics::JobForensics(boost::asio::io_context& io,
                           const LaunchOptions& options, Console& console,
                           const JobState& state, Hooks hooks)
    : options_(options),
      console_(console),
      state_(state),
      hooks_(std::move(hooks)),
      hang_abort_timer_(io) {}

void JobForensics::CollectStacks(const std::vector<int>& ranks,
                                 const std::string& why) {
  std::map<int, wire::Envelope> by_node;
  for (int rank : ranks) {
    auto it = state_.ranks().find(rank);
    if (it == state_.ranks().end()) continue;
    if (!it->second.started || it->second.exited) continue;
    stacks_pending_.insert(rank);
    auto& msg = by_node[it->second.node_rank];
    msg.mutable_collect_stacks()->add_ranks(rank);
    msg.mutable_collect_stacks()->set_reason(why);
  }
  for (const auto& [node, msg] : by_node) {
    if (state_.node(node).authenticated) hooks_.send(node, msg);
  }
}

void JobForensics::AbortForHang(int rank, const std::string& why) {
  if (hang_abort_) return;
  hang_abort_ = {rank, why};
  if (stacks_pending_.empty()) return FinishHangAbort();
  console_.Note("stopping the job (--on_hang abort) once the stacks are in");
  hang_abort_timer_.expires_after(kStacksWait);
  hang_abort_timer_.async_wait([this](const boost::system::error_code& ec) {
    if (!ec) FinishHangAbort();
  });
}

void JobForensics::FinishHangAbort() {
  hang_abort_timer_.cancel();
  if (!hang_abort_ || state_.phase() == Phase::kEnded) return;
  console_.Note("stopping the job: --on_hang abort");
  hooks_.hung(hang_abort_->first, hang_abort_->second);
}

void JobForensics::OnStacks(const wire::Stacks& s) {
  KeepStacks(s);
  stacks_pending_.erase(s.rank());
  if (hang_abort_ && stacks_pending_.empty()) FinishHangAbort();
}

void JobForensics::KeepStacks(const wire::Stacks& s) {
  const std::string who = "rank " + std::to_string(s.rank());
  if (!s.error().empty() || s.text().empty()) {
    return console_.Note(
        "no stacks of " + who + ": " +
        proto::EscapeControlChars(s.error().empty() ? "the tool printed nothing"
                                                    : s.error()));
  }
  if (stacks_.size() >= kMaxStackRanks && !stacks_.count(s.rank())) {
    return console_.Note("stacks of " + who + " not kept: already " +
                         std::to_string(kMaxStackRanks) + " ranks' stacks");
  }
  std::string text = s.text().substr(0, kMaxStacksBytes);
  std::string where;
  if (!options_.log_dir.empty()) {
    const std::string path =
        options_.log_dir + "/stacks-rank-" + std::to_string(s.rank()) + ".txt";
    auto file = SinkFile::Create(path, [](const Status&) {});
    if (file.ok()) {
      (*file)->Append(text);
      (*file)->Close();
      if ((*file)->status().ok()) where = "; all of it in " + path;
    }
  }
  console_.Note("stacks of " + who + " (" +
                proto::EscapeControlChars(s.tool()) + "), the first " +
                std::to_string(kStackLinesShown) + " lines" + where + ":");
  size_t start = 0;
  for (size_t n = 0; n < kStackLinesShown && start < text.size(); ++n) {
    size_t end = std::min(text.find('\n', start), text.size());
    console_.Note("  | " +
                  proto::EscapeControlChars(text.substr(start, end - start)));
    start = end + 1;
  }
  stacks_[s.rank()] = std::move(text);
}

void JobForensics::OnExited(const wire::WorkerExited& e) {
  if (e.oom_killed()) oom_[e.rank()] = e.oom_detail();
  // The first ranks' (the cause among them), as for stacks: a job of
  // thousands of failing ranks must not hold thousands of files.
  if (!e.error_file().empty() && error_files_.size() < kMaxErrorFileRanks)
    error_files_[e.rank()] = e.error_file().substr(0, kMaxErrorFileBytes);
}

}  // namespace dslaunch::launcher
