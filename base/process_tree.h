// Reads the process tree and the cgroup v2 layout from /proc (parent links in
// /proc/<pid>/stat; this needs no CONFIG_PROC_CHILDREN), for killing what a job
// left behind: by pid, never by name. Stateless functions; any thread.
#pragma once

#include <sys/types.h>  // pid_t

#include <cstdint>
#include <set>
#include <string>
#include <vector>

namespace dslaunch::base {

// True while `pid` exists and is not a zombie.
bool IsLiveProcess(pid_t pid);
// The parent of `pid`, or -1 when it is gone.
pid_t ParentOf(pid_t pid);
// When `pid` started, in clock ticks after boot (/proc/<pid>/stat's 22nd
// field): with the pid it names one process for good, since a pid reused
// later starts later. 0 when it is gone.
uint64_t ProcessStartTicks(pid_t pid);
// The live (not zombie) descendants of `root`, parents before children,
// leaving out the pids in `skip` and everything below them.
std::vector<pid_t> LiveDescendants(pid_t root,
                                   const std::set<pid_t>& skip = {});

// Sends `sig` to each of LiveDescendants(root, skip) that is still the
// process found: each is pinned with a pidfd and checked to hang below the
// tree still before any signal, so a pid that died and was reused by another
// process in between is left alone. `root` should be a child subreaper (the
// agent and the local starter are): a descendant orphaned by a death of its
// own accord before the check goes to init otherwise, out of the tree.
// Returns how many were signalled.
int SignalLiveDescendants(pid_t root, const std::set<pid_t>& skip, int sig);

// The mount point of the cgroup2 hierarchy in a /proc/self/mountinfo text,
// or "" when none is mounted (a bind-mounted subtree does not count).
std::string Cgroup2Mount(const std::string& mountinfo);
// The v2 cgroup path (the "0::" line) in a /proc/self/cgroup text, or "".
std::string Cgroup2Path(const std::string& proc_cgroup);
// The cgroup an agent makes for its job's workers, below this process's own
// cgroup v2: <mount><own>/dsl-<job id>-<node rank>-<agent pid> (the job id
// reduced to [A-Za-z0-9-]; the pid keeps two agents apart even with one job
// id), or "" when no cgroup2 is mounted. The local starter finds its agents'
// (its own cgroup is theirs) by the same name.
std::string JobCgroupDir(const std::string& job_id, int node_rank,
                         pid_t agent_pid);

}  // namespace dslaunch::base
