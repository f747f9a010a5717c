// Ranks: the agent's running ranks as the Agent sees them: spawned from a
// WorkerSpec, signalled, kept within reach with every descendant, their
// output read or paused; each rank's lines and its exit come back through
// the Delegate. WorkerSet (worker_set.h) is the real one; the Agent's tests
// use a fake. io_context thread only.
#pragma once

#include <sys/types.h>  // pid_t

#include <string>
#include <vector>

#include "base/process_set.h"  // ExitInfo
#include "base/status.h"

namespace dslaunch::agent {

using ExitInfo = base::ExitInfo;

struct WorkerSpec {
  int rank = 0;
  std::vector<std::string> argv;  // argv[0]: program, searched in env's PATH
  std::vector<std::string> env;   // "KEY=VALUE", the worker's whole environment
  std::string cwd;                // empty = the agent's
  std::vector<int> cpus;          // bound to these CPUs (empty = not bound)
  // The one process (and its descendants) the rank lets trace it under
  // Yama's ptrace_scope 1: the node's stack helper, never the agent, of
  // which every rank descends (0 = none; stack_helper.h).
  pid_t tracer = 0;
};

class Ranks {
 public:
  class Delegate {
   public:
    virtual ~Delegate() = default;
    virtual void OnWorkerOutput(int rank, bool is_stderr, std::string line,
                                bool partial) = 0;
    virtual void OnWorkerExited(int rank, pid_t pid, const ExitInfo& info) = 0;
  };

  virtual ~Ranks() = default;
  // Keeps every descendant of the ranks spawned from now on within reach
  // (the job's cgroup is named after `job_id` and `node_rank`).
  virtual void Contain(const std::string& job_id, int node_rank) = 0;
  // Starts a rank. A program that cannot be executed still yields a pid:
  // its exit carries the reason in ExitInfo::error.
  virtual StatusOr<pid_t> Spawn(const WorkerSpec& spec) = 0;
  // After the ranks started: the job's cgroup is guarded.
  virtual void GuardContainment() = 0;
  // The job's cgroup ("" when there is none).
  virtual std::string cgroup_dir() const = 0;
  // `sig` to the process group of every rank not yet reaped.
  virtual void SignalAll(int sig) = 0;
  // SIGKILLs every descendant until none is left.
  virtual void KillDescendants() = 0;
  // Between generations: every descendant killed, the next Contain()
  // starts afresh.
  virtual void EndGeneration() = 0;
  // Stop and restart reading the ranks' output (backpressure).
  virtual void PauseOutput() = 0;
  virtual void ResumeOutput() = 0;
  // Ranks spawned and not yet reported finished.
  virtual size_t unfinished() const = 0;
};

}  // namespace dslaunch::agent
