#include "base/process_tree.h"

#include <dirent.h>       // opendir, readdir
#include <signal.h>       // kill
#include <sys/syscall.h>  // SYS_pidfd_open, SYS_pidfd_send_signal
#include <unistd.h>       // syscall, close

#include <cctype>
#include <cerrno>
#include <cstdlib>  // strtol
#include <fstream>
#include <map>
#include <sstream>
#include <string>

namespace dslaunch::base {

namespace {

// {ppid, state} of a process from /proc/<pid>/stat; false when it is gone.
std::string StatText(pid_t pid);

bool ReadStat(pid_t pid, pid_t* ppid, char* state) {
  const std::string stat = StatText(pid);
  const size_t paren = stat.rfind(')');  // the name may hold ')' and spaces
  if (paren == std::string::npos || paren + 4 > stat.size()) return false;
  *state = stat[paren + 2];
  *ppid = static_cast<pid_t>(std::atol(stat.c_str() + paren + 4));
  return true;
}

std::string StatText(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

}  // namespace

uint64_t ProcessStartTicks(pid_t pid) {
  const std::string stat = StatText(pid);
  const size_t paren = stat.rfind(')');  // the name may hold ')' and spaces
  if (paren == std::string::npos) return 0;
  // After ") " come the fields from the 3rd on: the 22nd is the 20th there.
  std::istringstream rest(stat.substr(paren + 1));
  std::string field;
  for (int i = 0; i < 20 && rest >> field; ++i) {
  }
  return rest ? std::strtoull(field.c_str(), nullptr, 10) : 0;
}

bool IsLiveProcess(pid_t pid) {
  pid_t ppid;
  char state;
  return ReadStat(pid, &ppid, &state) && state != 'Z' && state != 'X';
}

pid_t ParentOf(pid_t pid) {
  pid_t ppid;
  char state;
  return ReadStat(pid, &ppid, &state) ? ppid : -1;
}

std::vector<pid_t> LiveDescendants(pid_t root, const std::set<pid_t>& skip) {
  std::map<pid_t, std::vector<pid_t>> children;
  if (DIR* proc = ::opendir("/proc")) {
    while (dirent* e = ::readdir(proc)) {
      char* end = nullptr;
      const long pid = std::strtol(e->d_name, &end, 10);
      pid_t ppid;
      char state;
      if (*end != '\0' || pid <= 0 || !ReadStat(pid, &ppid, &state)) continue;
      if (state != 'Z' && state != 'X') children[ppid].push_back(pid);
    }
    ::closedir(proc);
  }
  std::vector<pid_t> out;
  std::vector<pid_t> todo = {root};
  while (!todo.empty() && out.size() < 100000) {
    const pid_t p = todo.back();
    todo.pop_back();
    for (pid_t c : children[p]) {
      if (skip.count(c)) continue;
      out.push_back(c);
      todo.push_back(c);
    }
  }
  return out;
}

int SignalLiveDescendants(pid_t root, const std::set<pid_t>& skip, int sig) {
  const std::vector<pid_t> found = LiveDescendants(root, skip);
  std::set<pid_t> tree(found.begin(), found.end());
  tree.insert(root);
  // Every process is pinned and checked before any is signalled: a killed
  // parent would hand its children to init (or a subreaper) at once.
  std::vector<int> pinned;
  int sent = 0;
  for (pid_t pid : found) {
    const int fd = static_cast<int>(::syscall(SYS_pidfd_open, pid, 0));
    if (fd < 0) {
      // Before Linux 5.3 there is no pidfd: the plain kill, with its race.
      if (errno == ENOSYS && ::kill(pid, sig) == 0) ++sent;
      continue;  // ESRCH: gone already
    }
    // The pidfd holds the process: if this pid still hangs below the tree
    // now, it is the one found (or a new child of the tree: ours too).
    pid_t ppid;
    char state;
    if (ReadStat(pid, &ppid, &state) && state != 'Z' && state != 'X' &&
        tree.count(ppid) != 0) {
      pinned.push_back(fd);
    } else {
      ::close(fd);
    }
  }
  for (int fd : pinned) {
    if (::syscall(SYS_pidfd_send_signal, fd, sig, nullptr, 0) == 0) ++sent;
    ::close(fd);
  }
  return sent;
}

std::string Cgroup2Mount(const std::string& mountinfo) {
  std::istringstream lines(mountinfo);
  for (std::string line; std::getline(lines, line);) {
    std::istringstream f(line);
    std::vector<std::string> fields;
    for (std::string w; f >> w;) fields.push_back(w);
    for (size_t i = 6; i + 1 < fields.size(); ++i) {
      if (fields[i] == "-" && fields[i + 1] == "cgroup2" && fields[3] == "/") {
        return fields[4];
      }
    }
  }
  return "";
}

std::string Cgroup2Path(const std::string& proc_cgroup) {
  std::istringstream lines(proc_cgroup);
  for (std::string line; std::getline(lines, line);) {
    if (line.rfind("0::", 0) == 0) return line.substr(3);
  }
  return "";
}

std::string JobCgroupDir(const std::string& job_id, int node_rank,
                         pid_t agent_pid) {
  auto read = [](const char* path) {
    std::ifstream in(path);
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
  };
  const std::string mount = Cgroup2Mount(read("/proc/self/mountinfo"));
  const std::string own = Cgroup2Path(read("/proc/self/cgroup"));
  if (mount.empty() || own.empty()) return "";
  std::string id = job_id.substr(0, 200);
  for (char& ch : id) {
    if (!std::isalnum(static_cast<unsigned char>(ch)) && ch != '-') ch = '_';
  }
  return mount + (own == "/" ? "" : own) + "/dsl-" + id + "-" +
         std::to_string(node_rank) + "-" + std::to_string(agent_pid);
}

}  // namespace dslaunch::base
