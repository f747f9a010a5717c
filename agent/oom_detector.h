// OomDetector tells whether the kernel's OOM killer ended a rank that died of
// a SIGKILL the agent did not send: by the kernel log (/dev/kmsg, read from
// where it stood when the job's first rank started) when it is readable, else
// by the oom_kill counter of the job's cgroup or its nearest ancestor with
// memory.events. Costs nothing until asked. Owned by RankMonitor; io_context
// thread only.
#pragma once

#include <sys/types.h>  // pid_t

#include <cstdint>
#include <deque>
#include <map>
#include <optional>
#include <string>
#include <string_view>

namespace dslaunch::agent {

struct OomOptions {
  std::string kmsg_path = "/dev/kmsg";
  // "" = the mount point of cgroup2 from /proc/self/mountinfo.
  std::string cgroup_mount;
  // Kernel log records read per Explain at most (each read is one record).
  size_t max_records = 20000;
};

class OomDetector {
 public:
  explicit OomDetector(OomOptions options = {});
  ~OomDetector();
  OomDetector(const OomDetector&) = delete;
  OomDetector& operator=(const OomDetector&) = delete;

  // A rank started; `cgroup_dir` is the job's cgroup ("" = none: the agent's
  // own). The first call notes where the kernel log stands and which
  // memory.events to watch; every call notes its oom_kill counter.
  void NoteSpawned(int rank, const std::string& cgroup_dir);
  void Forget(int rank) { baseline_.erase(rank); }
  // Rank `rank` (main process `pid`) ended by a SIGKILL: the evidence, when
  // the OOM killer did it ("kernel log: ..." or "oom-kill in <cgroup> ...").
  std::optional<std::string> Explain(int rank, pid_t pid);

 private:
  void Start(const std::string& cgroup_dir);
  void ReadKernelLog();
  std::optional<std::string> FromKernelLog(pid_t pid) const;
  std::optional<std::string> FromCgroup(int rank) const;

  OomOptions options_;
  bool started_ = false;
  int kmsg_fd_ = -1;
  std::deque<std::string> oom_lines_;  // the last kernel OOM messages seen
  std::string events_dir_;  // the cgroup whose memory.events is watched
  std::string job_cgroup_;  // the job's own cgroup ("" when none)
  std::map<int, int64_t> baseline_;  // rank -> oom_kill when it started
};

// The message of one /dev/kmsg record ("6,1234,5678,-;Out of memory: ...")
// when it is the OOM killer's about `pid` ("Killed process <pid> (" or
// "oom-kill:...,pid=<pid>,"), else "".
std::string OomKillMessage(std::string_view record, pid_t pid);
// True when a record's message is one of the OOM killer's (any pid).
bool IsOomKillRecord(std::string_view record);
// The oom_kill counter of a memory.events text, or -1 without one.
int64_t OomKillCount(std::string_view memory_events);
// The nearest of `dir` and its ancestors below `mount` that has a
// memory.events file, or "".
std::string MemoryEventsDir(std::string dir, const std::string& mount);
// A memory.max text as words: "64 MiB", "max" stays "max".
std::string DescribeMemoryMax(std::string_view memory_max);

}  // namespace dslaunch::agent
