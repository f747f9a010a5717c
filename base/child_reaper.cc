#include "base/child_reaper.h"

#include <signal.h>    // SIGCHLD
#include <sys/wait.h>  // waitid, waitpid

#include <cerrno>
#include <vector>

namespace dslaunch::base {

namespace asio = boost::asio;

asio::execution_context::id ChildReaper::id;

ChildReaper::ChildReaper(asio::io_context& io)
    : asio::execution_context::service(io),
      sigchld_(std::make_unique<asio::signal_set>(io, SIGCHLD)) {
  Wait();
}

ChildReaper::~ChildReaper() { *alive_ = false; }

ChildReaper& ChildReaper::Of(asio::io_context& io) {
  return asio::use_service<ChildReaper>(io);
}

void ChildReaper::shutdown() {
  *alive_ = false;
  sigchld_.reset();
  watched_.clear();
  on_orphan_ = nullptr;
}

void ChildReaper::Watch(pid_t pid, Watcher watcher) {
  watched_[pid] = std::move(watcher);
}

void ChildReaper::Forget(pid_t pid) {
  auto it = watched_.find(pid);
  if (it != watched_.end()) it->second = Watcher{};
}

void ChildReaper::ReapOrphans(std::function<void(pid_t, int)> on_orphan) {
  on_orphan_ = std::move(on_orphan);
  if (on_orphan_) ReapAny();  // orphans may already be waiting
}

void ChildReaper::Wait() {
  sigchld_->async_wait(
      [this, alive = alive_](const boost::system::error_code& ec, int) {
        if (ec || !*alive) return;
        if (on_orphan_) {
          ReapAny();
        } else {
          ReapWatched();
        }
        if (*alive && sigchld_) Wait();
      });
}

// Looks at each watched pid without reaping (WNOWAIT) and reaps the ended.
void ChildReaper::ReapWatched() {
  std::vector<pid_t> pids;
  for (const auto& [pid, w] : watched_) pids.push_back(pid);
  for (pid_t pid : pids) {
    siginfo_t si{};
    if (::waitid(P_PID, static_cast<id_t>(pid), &si,
                 WEXITED | WNOHANG | WNOWAIT) == 0 &&
        si.si_pid == pid) {
      Reap(pid);
    }
  }
}

// As a subreaper: every ended child, watched or not, one at a time.
void ChildReaper::ReapAny() {
  for (int i = 0; i < 100000; ++i) {
    siginfo_t si{};
    if (::waitid(P_ALL, 0, &si, WEXITED | WNOHANG | WNOWAIT) != 0 ||
        si.si_pid == 0) {
      return;
    }
    const pid_t pid = si.si_pid;
    if (watched_.count(pid)) {
      Reap(pid);
      continue;
    }
    int status = 0;
    if (::waitpid(pid, &status, 0) != pid) return;
    if (on_orphan_) on_orphan_(pid, status);
  }
}

void ChildReaper::Reap(pid_t pid) {
  Watcher w = std::move(watched_[pid]);
  watched_.erase(pid);
  if (w.before_reap) w.before_reap();
  int status = 0;
  pid_t got;
  do {
    got = ::waitpid(pid, &status, 0);
  } while (got < 0 && errno == EINTR);
  if (got == pid && w.on_reaped) w.on_reaped(status);
}

}  // namespace dslaunch::base
