#include "agent/worker_set.h"

#include <spdlog/spdlog.h>

#include "base/child_reaper.h"

namespace dslaunch::agent {

WorkerSet::WorkerSet(boost::asio::io_context& io, Delegate* delegate)
    : io_(io), delegate_(delegate), processes_(io, this) {}

WorkerSet::~WorkerSet() { base::ChildReaper::Of(io_).ReapOrphans(nullptr); }

void WorkerSet::Contain(const std::string& job_id, int node_rank) {
  containment_.SetUp(job_id, node_rank);
  // Orphans the kernel reparents to us are reaped, never reported.
  base::ChildReaper::Of(io_).ReapOrphans([](pid_t pid, int) {
    spdlog::debug("reaped orphaned descendant {}", pid);
  });
}

base::ProcessSpec WorkerProcessSpec(const WorkerSpec& spec,
                                    const std::string& cgroup_dir) {
  base::ProcessSpec p;
  p.argv = spec.argv;
  p.env = spec.env;
  p.cwd = spec.cwd;
  p.cpus = spec.cpus;
  p.death_signal = SIGKILL;
  p.tracer = spec.tracer;  // stacks of a hung rank (stack_helper.h)
  p.cgroup_dir = cgroup_dir;
  return p;
}

StatusOr<pid_t> WorkerSet::Spawn(const WorkerSpec& spec) {
  const base::ProcessSpec p =
      WorkerProcessSpec(spec, containment_.cgroup_dir());
  containment_.NoteSpawned();
  ASSIGN_OR_RETURN(pid_t pid, processes_.Spawn(p));
  ranks_[pid] = spec.rank;
  return pid;
}

void WorkerSet::OnProcessOutput(pid_t pid, bool is_stderr, std::string line,
                                bool partial) {
  delegate_->OnWorkerOutput(ranks_[pid], is_stderr, std::move(line), partial);
}

void WorkerSet::OnProcessExited(pid_t pid, const ExitInfo& info) {
  const int rank = ranks_[pid];
  ranks_.erase(pid);
  delegate_->OnWorkerExited(rank, pid, info);
}

}  // namespace dslaunch::agent
