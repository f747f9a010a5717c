#include "agent/run_dirs.h"

#include <dirent.h>
#include <fcntl.h>
#include <stdlib.h>  // mkdtemp
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cinttypes>
#include <cstdio>
#include <filesystem>

#include "base/process_tree.h"  // ProcessStartTicks

namespace dslaunch::agent {
namespace {

std::string Prefix(const std::string& job_id) {
  return "dsl-" + job_id.substr(0, 8) + "-";
}

// The agent a run directory names, or false when the file is not one.
bool ReadOwner(const std::string& dir, long long* pid,
               unsigned long long* ticks) {
  const int fd =
      ::open((dir + "/agent").c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) return false;
  char buf[64] = {0};
  const ssize_t n = ::read(fd, buf, sizeof(buf) - 1);
  ::close(fd);
  if (n <= 0) return false;
  char end = 0;
  return std::sscanf(buf, "%lld %llu%c", pid, ticks, &end) == 3 &&
         end == '\n' && *pid > 0;
}

}  // namespace

StatusOr<std::string> MakeRunDir(const std::string& parent,
                                 const std::string& job_id) {
  std::string tmpl = parent + "/" + Prefix(job_id) + "XXXXXX";
  if (::mkdtemp(tmpl.data()) == nullptr)
    return ErrnoStatus("cannot create run directory " + tmpl, errno);
  const std::string owner =
      std::to_string(::getpid()) + " " +
      std::to_string(base::ProcessStartTicks(::getpid())) + "\n";
  const int fd =
      ::open((tmpl + "/agent").c_str(),
             O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
  if (fd < 0) return ErrnoStatus("cannot write " + tmpl + "/agent", errno);
  const bool written = ::write(fd, owner.data(), owner.size()) ==
                       static_cast<ssize_t>(owner.size());
  ::close(fd);
  if (!written) return Internal("cannot write " + tmpl + "/agent");
  return tmpl;
}

int RemoveDeadAgentsRunDirs(const std::string& parent,
                            const std::string& job_id) {
  const std::string prefix = Prefix(job_id);
  DIR* d = ::opendir(parent.c_str());
  if (d == nullptr) return 0;
  int removed = 0;
  while (dirent* e = ::readdir(d)) {
    const std::string name = e->d_name;
    if (name.size() != prefix.size() + 6 || name.rfind(prefix, 0) != 0)
      continue;
    const std::string path = parent + "/" + name;
    struct stat st {};
    if (::lstat(path.c_str(), &st) != 0 || !S_ISDIR(st.st_mode) ||
        st.st_uid != ::geteuid())
      continue;
    long long pid = 0;
    unsigned long long ticks = 0;
    if (!ReadOwner(path, &pid, &ticks)) continue;
    if (pid == ::getpid()) continue;  // ours (an earlier generation's)
    const uint64_t now = base::ProcessStartTicks(static_cast<pid_t>(pid));
    if (now != 0 && now == ticks) continue;  // its agent still runs
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
    if (!ec) ++removed;
  }
  ::closedir(d);
  return removed;
}

}  // namespace dslaunch::agent
