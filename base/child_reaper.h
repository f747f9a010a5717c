// ChildReaper is the one SIGCHLD handler of a process: an io_context service
// (one per io_context, and a process has one io_context) holding an
// asio::signal_set on SIGCHLD. Owners of children (ProcessSets) Watch the
// pids they spawned; on SIGCHLD each watched pid that has ended is reaped
// with waitid on that pid only, so two owners can never take each other's
// children. A child subreaper (the agent) may also ask to reap the orphans
// the kernel reparents to it. io_context thread only.
#pragma once

#include <sys/types.h>  // pid_t

#include <boost/asio/execution_context.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/signal_set.hpp>
#include <functional>
#include <map>
#include <memory>

namespace dslaunch::base {

class ChildReaper : public boost::asio::execution_context::service {
 public:
  // Runs while the ended child is still a zombie, so its pid (and process
  // group id) cannot be reused yet: the place to kill what is left of its
  // group. Then the child is reaped and `on_reaped(wait_status)` runs.
  struct Watcher {
    std::function<void()> before_reap;
    std::function<void(int wait_status)> on_reaped;
  };

  static boost::asio::execution_context::id id;
  explicit ChildReaper(boost::asio::io_context& io);
  ~ChildReaper() override;
  // The reaper of `io`, made on first use.
  static ChildReaper& Of(boost::asio::io_context& io);

  void Watch(pid_t pid, Watcher watcher);
  // Stops reporting `pid`; it is still reaped (without a report) when it
  // ends, so no zombie is left behind.
  void Forget(pid_t pid);
  // Also reaps ended children nobody watches (orphaned descendants a child
  // subreaper adopted), calling `on_orphan(pid, wait_status)` for each;
  // an empty function stops it.
  void ReapOrphans(std::function<void(pid_t, int)> on_orphan);
  size_t watched() const { return watched_.size(); }

 private:
  void shutdown() override;
  void Wait();
  void ReapWatched();
  void ReapAny();
  void Reap(pid_t pid);

  std::unique_ptr<boost::asio::signal_set> sigchld_;
  std::map<pid_t, Watcher> watched_;
  std::function<void(pid_t, int)> on_orphan_;
  std::shared_ptr<bool> alive_ = std::make_shared<bool>(true);
};

}  // namespace dslaunch::base
