// JobContainment keeps every process a job's workers start within the
// agent's reach, so that nothing of a job outlives it: a cgroup v2 child of
// the agent's own cgroup when one is writable (workers join it before they
// exec; a small guard process empties it if the agent itself is killed),
// and always the agent as a child subreaper, so that orphaned descendants
// (setsid, double fork) are reparented to it and found by a /proc walk.
// Owned by WorkerSet; io_context thread only.
#pragma once

#include <sys/types.h>  // pid_t

#include <string>
#include <vector>

namespace dslaunch::agent {

class JobContainment {
 public:
  JobContainment() = default;
  // Kills what is left, removes the cgroup and lets the guard go.
  ~JobContainment();
  JobContainment(const JobContainment&) = delete;
  JobContainment& operator=(const JobContainment&) = delete;

  // Makes this process a child subreaper and, where it can, makes the
  // job's cgroup (base::JobCgroupDir). Logs the mechanism once at info.
  void SetUp(const std::string& job_id, int node_rank);
  // With a cgroup: forks the guard that kills and removes it should this
  // process be SIGKILLed. Called once the workers run (off the launch path:
  // until then a SIGKILL takes the workers by PR_SET_PDEATHSIG).
  void StartGuard();
  // The cgroup directory workers join, or "" when there is none.
  const std::string& cgroup_dir() const { return cgroup_dir_; }
  // A worker was started: the next teardown must look again.
  void NoteSpawned() { all_gone_ = false; }
  // "cgroup <dir>" or "subreaper".
  std::string mechanism() const;
  // SIGKILLs everything in the cgroup and every live descendant of this
  // process (never the guard), repeating until none is left (bounded).
  void KillAll();
  // A generation of a restarted job ended: KillAll, then the cgroup is
  // removed and its guard let go; the next SetUp makes a new one, named
  // with the generation. Never reused: on some kernels (seen on 6.18) a
  // cgroup once killed through cgroup.kill kills every process later
  // cloned into it with CLONE_INTO_CGROUP.
  void EndGeneration();

 private:
  void RemoveCgroup();

  bool set_up_ = false;
  int generation_ = 0;
  // The last KillAll found nothing left; no worker was spawned since.
  bool all_gone_ = false;
  std::string cgroup_dir_;
  pid_t guard_pid_ = -1;
  int guard_fd_ = -1;  // our end of the guard's lifeline
};

}  // namespace dslaunch::agent
