// RankMonitor watches this node's live ranks for the launcher (issue 12):
// about once a second a RankStats message with each live rank's resident
// set; stacks on CollectStacks (through the stack helper, stack_helper.h);
// and, when a rank exits, what explains it: the kernel's OOM killer
// (OomDetector) and the rank's TORCHELASTIC_ERROR_FILE. Owned by the Agent;
// io_context thread only.
#pragma once

#include <sys/types.h>  // pid_t

#include <boost/asio/io_context.hpp>
#include <boost/asio/steady_timer.hpp>
#include <chrono>
#include <functional>
#include <map>
#include <string>

#include "agent/oom_detector.h"
#include "agent/stack_helper.h"
#include "base/process_set.h"  // ExitInfo
#include "proto/dslaunch.pb.h"

namespace dslaunch::agent {

struct RankMonitorOptions {
  std::chrono::milliseconds stats_interval{1000};
  StackHelperOptions stacks;
  OomOptions oom;
};

class RankMonitor {
 public:
  using Send = std::function<void(const wire::Envelope&)>;

  RankMonitor(boost::asio::io_context& io, Send send,
              RankMonitorOptions options = {});
  RankMonitor(const RankMonitor&) = delete;
  RankMonitor& operator=(const RankMonitor&) = delete;

  // Rank `rank` runs as `pid`; its TORCHELASTIC_ERROR_FILE is `error_file`,
  // its cgroup `cgroup_dir` ("" = none of its own).
  void OnStarted(int rank, pid_t pid, const std::string& error_file,
                 const std::string& cgroup_dir);
  // Rank `rank` ended as `info` says: completes `exited` with the OOM
  // verdict (a SIGKILL the agent did not send) and, for a failure, the
  // error file. Nothing is read for a rank that exited 0.
  void OnExited(int rank, const base::ExitInfo& info,
                wire::WorkerExited* exited);
  // The pid every rank must name as its tracer (PR_SET_PTRACER): the stack
  // helper's, which this starts on the first call; 0 when there is none.
  pid_t StackTracer() { return stacks_.Tracer(); }
  // Replies one Stacks message per named rank of this node (ranks of other
  // nodes are not ours to answer).
  void HandleCollectStacks(const wire::CollectStacks& request);
  // The job is over: no more stats, tools killed.
  void Stop();

 private:
  struct Rank {
    pid_t pid = -1;  // -1: exited
    std::string error_file;
  };
  void ArmStats();
  void SendStats();

  Send send_;
  RankMonitorOptions options_;
  std::map<int, Rank> ranks_;  // every rank started on this node
  size_t live_ = 0;
  boost::asio::steady_timer stats_timer_;
  bool stats_armed_ = false;
  bool stopped_ = false;
  OomDetector oom_;
  StackHelperClient stacks_;
};

// Resident set of process `pid` in bytes (/proc/<pid>/statm), -1 if gone.
int64_t ResidentBytes(pid_t pid);

}  // namespace dslaunch::agent
