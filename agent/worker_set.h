// WorkerSet owns the agent's running workers: it spawns each through a
// base::ProcessSet (own process group, PR_SET_PDEATHSIG(SIGKILL), stdin
// from /dev/null, output cut into whole lines, exit reported after the last
// line) and speaks in ranks to its Delegate. With Contain() every process
// the workers start stays within reach (cgroup or subreaper, see
// JobContainment): orphaned descendants are reaped here and never reported
// as worker exits, and KillDescendants() ends them all. Owned by the Agent;
// io_context thread only.
#pragma once

#include <sys/types.h>  // pid_t

#include <boost/asio/io_context.hpp>
#include <map>
#include <string>
#include <vector>

#include "agent/job_containment.h"
#include "agent/ranks.h"
#include "base/process_set.h"
#include "base/status.h"

namespace dslaunch::agent {

// How WorkerSet starts the worker of `spec` (in the cgroup `cgroup_dir`).
base::ProcessSpec WorkerProcessSpec(const WorkerSpec& spec,
                                    const std::string& cgroup_dir);

using base::ResolveProgram;

class WorkerSet : public Ranks, private base::ProcessSet::Delegate {
 public:
  using Delegate = Ranks::Delegate;

  WorkerSet(boost::asio::io_context& io, Delegate* delegate);
  // SIGKILLs the process group of every worker still running, then (when
  // contained) every descendant, and removes the job's cgroup.
  ~WorkerSet() override;
  WorkerSet(const WorkerSet&) = delete;
  WorkerSet& operator=(const WorkerSet&) = delete;

  // Keeps every descendant of the workers spawned from now on within reach
  // (the job's cgroup is named after `job_id` and `node_rank`).
  void Contain(const std::string& job_id, int node_rank) override;
  // Starts a worker. A program that cannot be executed still yields a pid:
  // the child exits 127 and the exit carries the reason in ExitInfo::error.
  StatusOr<pid_t> Spawn(const WorkerSpec& spec) override;
  // Sends `sig` to the process group of every worker not yet reaped.
  void SignalAll(int sig) override { processes_.SignalAll(sig); }
  // SIGKILLs every descendant (cgroup and /proc walk) until none is left.
  void KillDescendants() override { containment_.KillAll(); }
  // Between generations: every descendant killed, the next Contain()
  // starts afresh (JobContainment::EndGeneration).
  void EndGeneration() override { containment_.EndGeneration(); }
  // After the workers started: guards the job's cgroup (JobContainment).
  void GuardContainment() override { containment_.StartGuard(); }
  // Stop/restart reading worker output (backpressure from the channel).
  void PauseOutput() override { processes_.PauseOutput(); }
  void ResumeOutput() override { processes_.ResumeOutput(); }
  // Workers spawned and not yet reported finished.
  size_t unfinished() const override { return processes_.unfinished(); }
  std::string cgroup_dir() const override { return containment_.cgroup_dir(); }
  const JobContainment& containment() const { return containment_; }

 private:
  void OnProcessOutput(pid_t pid, bool is_stderr, std::string line,
                       bool partial) override;
  void OnProcessExited(pid_t pid, const ExitInfo& info) override;

  boost::asio::io_context& io_;
  Delegate* delegate_;
  JobContainment containment_;  // outlives processes_: killed after them
  base::ProcessSet processes_;
  std::map<pid_t, int> ranks_;
};

}  // namespace dslaunch::agent
