#include "agent/probe_files.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <ctime>

namespace dslaunch::agent {

std::string ReadyFileText(int node_rank) {
  return node_rank < 0 ? "joined\n"
                       : "node " + std::to_string(node_rank) + "\n";
}

bool IsReadyFileText(const std::string& text) {
  if (text == "joined\n") return true;
  if (text.rfind("node ", 0) != 0 || text.size() < 7 || text.back() != '\n')
    return false;
  return text.find_first_not_of("0123456789", 5) == text.size() - 1;
}

bool LeftByAnAgent(const std::string& path) {
  struct stat st {};
  if (::lstat(path.c_str(), &st) != 0 || !S_ISREG(st.st_mode) ||
      st.st_uid != ::geteuid() || st.st_size > 64)
    return false;
  const int fd = ::open(path.c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) return false;
  char buf[65] = {0};
  const ssize_t n = ::read(fd, buf, sizeof(buf) - 1);
  ::close(fd);
  if (n < 0) return false;
  const std::string text(buf, static_cast<size_t>(n));
  return text == kAliveText || IsReadyFileText(text);
}

Status ClaimProbeFile(const std::string& flag, const std::string& path,
                      bool* removed) {
  *removed = false;
  struct stat st {};
  if (::lstat(path.c_str(), &st) != 0) {
    if (errno == ENOENT) return Status::Ok();
    return ErrnoStatus(flag + " " + path, errno);
  }
  if (!LeftByAnAgent(path)) {
    return InvalidArgument(
        flag + " " + path +
        " exists and is not one an agent left: the agent makes it and "
        "removes it at the end, so it must name a new file");
  }
  if (::unlink(path.c_str()) != 0)
    return ErrnoStatus(flag + " " + path + ": cannot remove", errno);
  *removed = true;
  return Status::Ok();
}

int CheckAlive(const std::string& path, double within_s) {
  struct stat st {};
  if (::lstat(path.c_str(), &st) != 0) {
    std::fprintf(stderr, "dsagent: --alive_check %s: %s\n", path.c_str(),
                 std::strerror(errno));
    return 1;
  }
  struct timespec now {};
  ::clock_gettime(CLOCK_REALTIME, &now);
  const double age =
      static_cast<double>(now.tv_sec - st.st_mtim.tv_sec) +
      static_cast<double>(now.tv_nsec - st.st_mtim.tv_nsec) / 1e9;
  if (age <= within_s) return 0;
  std::fprintf(stderr,
               "dsagent: --alive_check %s: last touched %.0f s ago (more "
               "than %g s): the agent's loop is stuck or stopped\n",
               path.c_str(), age, within_s);
  return 1;
}

}  // namespace dslaunch::agent
