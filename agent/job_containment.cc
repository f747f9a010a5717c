#include "agent/job_containment.h"

#include <fcntl.h>   // open
#include <signal.h>  // kill, signal
#include <spdlog/spdlog.h>
#include <sys/prctl.h>  // PR_SET_CHILD_SUBREAPER
#include <sys/stat.h>   // mkdir
#include <time.h>       // nanosleep
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>
#include <utility>  // exchange

#include "base/process_tree.h"

namespace dslaunch::agent {

namespace {

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// Async-signal-safe (used by the guard after fork too).
bool WriteString(const char* path, const char* text) {
  const int fd = ::open(path, O_WRONLY | O_CLOEXEC);
  if (fd < 0) return false;
  const size_t len = std::strlen(text);
  const bool ok = ::write(fd, text, len) == static_cast<ssize_t>(len);
  ::close(fd);
  return ok;
}

void SleepMs(long ms) {
  timespec ts{0, ms * 1000000L};
  ::nanosleep(&ts, nullptr);
}

// Pids listed in a cgroup's cgroup.procs that are still alive.
std::vector<pid_t> LiveMembers(const std::string& dir) {
  std::vector<pid_t> pids;
  std::istringstream in(ReadFile(dir + "/cgroup.procs"));
  for (pid_t pid; in >> pid;) {
    if (base::IsLiveProcess(pid)) pids.push_back(pid);
  }
  return pids;
}

}  // namespace

JobContainment::~JobContainment() {
  if (!set_up_) return;
  if (!all_gone_) KillAll();  // Finish usually did, and nothing runs since
  RemoveCgroup();
  if (guard_fd_ >= 0) ::close(guard_fd_);  // the guard finds nothing left
}

void JobContainment::SetUp(const std::string& job_id, int node_rank) {
  if (set_up_) return;
  set_up_ = true;
  ::prctl(PR_SET_CHILD_SUBREAPER, 1);
  std::string dir = base::JobCgroupDir(job_id, node_rank, ::getpid());
  if (!dir.empty() && generation_ > 0)
    dir += "-g" + std::to_string(generation_);
  // Never join a cgroup that exists: another agent's would be killed with
  // ours. One left empty by a dead agent with our pid is removed first (a
  // cgroup with processes cannot be removed, and then mkdir fails).
  if (!dir.empty()) ::rmdir(dir.c_str());
  if (!dir.empty() && ::mkdir(dir.c_str(), 0700) == 0) {
    cgroup_dir_ = dir;
  } else if (!dir.empty()) {
    spdlog::debug("cannot make cgroup {}: {}", dir, std::strerror(errno));
  }
  spdlog::info("job containment: {}", mechanism());
}

std::string JobContainment::mechanism() const {
  return cgroup_dir_.empty() ? "subreaper" : "cgroup " + cgroup_dir_;
}

// The guard outlives an agent that is SIGKILLed: when its lifeline (a pipe
// from us) reaches end of file, it kills the cgroup and removes it.
void JobContainment::StartGuard() {
  if (cgroup_dir_.empty() || guard_pid_ > 0) return;
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0) return;
  const std::string kill_path = cgroup_dir_ + "/cgroup.kill";
  const std::string dir = cgroup_dir_;
  const pid_t pid = ::fork();
  if (pid < 0) {
    ::close(fds[0]);
    ::close(fds[1]);
    return;
  }
  if (pid == 0) {     // async-signal-safe calls only from here
    ::setpgid(0, 0);  // not hit by signals to the agent's group
    for (int sig : {SIGTERM, SIGINT, SIGHUP, SIGPIPE}) ::signal(sig, SIG_IGN);
    // Keep only the lifeline: the control socket and listeners must close
    // when the agent dies, not when the guard is done.
    ::dup2(fds[0], 0);
    if (::close_range(1, ~0U, 0) != 0) {
      for (int fd = 1; fd < 65536; ++fd) ::close(fd);
    }
    char byte;
    while (::read(0, &byte, 1) < 0 && errno == EINTR) {
    }
    for (int i = 0; i < 400 && ::rmdir(dir.c_str()) != 0 && errno == EBUSY;
         ++i) {
      WriteString(kill_path.c_str(), "1");
      SleepMs(5);
    }
    ::_exit(0);
  }
  ::close(fds[0]);
  guard_pid_ = pid;
  guard_fd_ = fds[1];
}

void JobContainment::KillAll() {
  if (!set_up_) return;
  for (int round = 0; round < 400; ++round) {  // at most about 2 s
    bool any = false;
    if (!cgroup_dir_.empty()) {
      const std::vector<pid_t> members = LiveMembers(cgroup_dir_);
      if (!members.empty() &&
          !WriteString((cgroup_dir_ + "/cgroup.kill").c_str(), "1")) {
        for (pid_t pid : members) ::kill(pid, SIGKILL);  // before 5.14
      }
      any |= !members.empty();
    }
    // With a cgroup, its members are the job (every descendant inherits it;
    // only root can move a process out): the /proc walk, which costs a few
    // ms of teardown per node, is for nodes without one.
    if (cgroup_dir_.empty() &&
        base::SignalLiveDescendants(::getpid(), {guard_pid_}, SIGKILL) > 0) {
      any = true;
    }
    if (!any) {
      all_gone_ = true;
      return;
    }
    all_gone_ = false;
    SleepMs(5);
  }
  spdlog::warn("descendants of the job still alive after SIGKILL");
}

void JobContainment::EndGeneration() {
  if (!set_up_) return;
  if (!all_gone_) KillAll();
  RemoveCgroup();
  // The guard finds nothing left, exits, and is reaped as an orphan.
  if (guard_fd_ >= 0) ::close(std::exchange(guard_fd_, -1));
  guard_pid_ = -1;
  set_up_ = false;
  ++generation_;
}

void JobContainment::RemoveCgroup() {
  if (cgroup_dir_.empty()) return;
  for (int i = 0; i < 200; ++i) {
    if (::rmdir(cgroup_dir_.c_str()) == 0 || errno == ENOENT) break;
    if (errno != EBUSY) {
      spdlog::warn("cannot remove cgroup {}: {}", cgroup_dir_,
                   std::strerror(errno));
      break;
    }
    SleepMs(5);
  }
  cgroup_dir_.clear();
}

}  // namespace dslaunch::agent
