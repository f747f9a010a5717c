#include "agent/rank_monitor.h"

#include <fcntl.h>   // open
#include <signal.h>  // SIGKILL
#include <spdlog/spdlog.h>
#include <unistd.h>  // read, sysconf

#include <cinttypes>  // SCNd64
#include <cstdio>

#include "agent/error_file.h"
#include "base/unix_time.h"

namespace dslaunch::agent {

int64_t ResidentBytes(pid_t pid) {
  const std::string path = "/proc/" + std::to_string(pid) + "/statm";
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return -1;
  char buf[128];  // "size resident shared text lib data dt"
  const ssize_t n = ::read(fd, buf, sizeof(buf) - 1);
  ::close(fd);
  if (n <= 0) return -1;
  buf[n] = '\0';
  int64_t size = 0, resident = 0;
  if (std::sscanf(buf, "%" SCNd64 " %" SCNd64, &size, &resident) != 2)
    return -1;
  static const int64_t page = ::sysconf(_SC_PAGESIZE);
  return resident * page;
}

RankMonitor::RankMonitor(boost::asio::io_context& io, Send send,
                         RankMonitorOptions options)
    : send_(std::move(send)),
      options_(std::move(options)),
      stats_timer_(io),
      oom_(options_.oom),
      stacks_(
          io,
          [this](const wire::Stacks& s) {
            wire::Envelope env;
            *env.mutable_stacks() = s;
            send_(env);
          },
          options_.stacks) {}

void RankMonitor::OnStarted(int rank, pid_t pid, const std::string& error_file,
                            const std::string& cgroup_dir) {
  if (stopped_) return;
  Rank& r = ranks_[rank];
  if (r.pid < 0) ++live_;
  r.pid = pid;
  r.error_file = error_file;
  oom_.NoteSpawned(rank, cgroup_dir);
  ArmStats();
}

void RankMonitor::OnExited(int rank, const base::ExitInfo& info,
                           wire::WorkerExited* exited) {
  const auto it = ranks_.find(rank);
  if (it == ranks_.end() || it->second.pid < 0) return;
  const pid_t pid = it->second.pid;
  it->second.pid = -1;
  --live_;
  if (info.signal == SIGKILL && !info.signalled) {
    if (auto detail = oom_.Explain(rank, pid)) {
      spdlog::warn("rank {} (pid {}) was killed by the OOM killer: {}", rank,
                   pid, *detail);
      exited->set_oom_killed(true);
      exited->set_oom_detail(*detail);
    }
  }
  oom_.Forget(rank);
  stacks_.Exited(rank);
  if (info.signal == 0 && info.exit_code == 0) return;
  auto text = ReadErrorFile(it->second.error_file);
  if (!text.ok()) {
    spdlog::warn("rank {}: TORCHELASTIC_ERROR_FILE: {}", rank,
                 text.status().message());
  } else if (!text->empty()) {
    exited->set_error_file(std::move(*text));
  }
}

void RankMonitor::HandleCollectStacks(const wire::CollectStacks& request) {
  spdlog::info("collecting stacks of {} rank(s): {}", request.ranks_size(),
               request.reason());
  for (const int rank : request.ranks()) {
    const auto it = ranks_.find(rank);
    if (it == ranks_.end()) continue;  // another node's
    if (it->second.pid < 0 || stopped_) {
      wire::Envelope env;
      env.mutable_stacks()->set_rank(rank);
      env.mutable_stacks()->set_error("rank " + std::to_string(rank) +
                                      " is not running");
      send_(env);
      continue;
    }
    stacks_.Collect(rank, it->second.pid);
  }
}

void RankMonitor::Stop() {
  stopped_ = true;
  stats_timer_.cancel();
  stacks_.Stop();
}

void RankMonitor::ArmStats() {
  if (stats_armed_ || stopped_ || live_ == 0) return;
  stats_armed_ = true;
  stats_timer_.expires_after(options_.stats_interval);
  stats_timer_.async_wait([this](const boost::system::error_code& ec) {
    stats_armed_ = false;
    if (ec || stopped_) return;
    SendStats();
    ArmStats();  // not while no rank runs
  });
}

void RankMonitor::SendStats() {
  wire::Envelope env;
  auto* stats = env.mutable_rank_stats();
  for (const auto& [rank, r] : ranks_) {
    if (r.pid < 0) continue;
    const int64_t rss = ResidentBytes(r.pid);
    if (rss <= 0) continue;  // gone, or a zombie not yet reaped (no mm)
    auto* e = stats->add_entries();
    e->set_rank(rank);
    e->set_rss_bytes(rss);
  }
  if (stats->entries_size() == 0) return;
  stats->set_time(base::UnixSeconds());
  send_(env);
}

}  // namespace dslaunch::agent
