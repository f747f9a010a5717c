#include "agent/error_file.h"

#include <fcntl.h>     // open, O_NOFOLLOW
#include <sys/stat.h>  // fstat
#include <unistd.h>    // read, close

#include <cerrno>

namespace dslaunch::agent {

StatusOr<std::string> ReadErrorFile(const std::string& path, size_t max_bytes) {
  // O_NONBLOCK: opening a FIFO for reading must not wait for a writer.
  const int fd =
      ::open(path.c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0 && errno == ENOENT) return std::string();
  if (fd < 0 && errno == ELOOP)
    return InvalidArgument(path + " is a symlink (not followed)");
  if (fd < 0) return ErrnoStatus("cannot open " + path, errno);
  struct stat st;
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    return InvalidArgument(path + " is not a regular file");
  }
  std::string data(max_bytes, '\0');
  size_t got = 0;
  while (got < max_bytes) {
    const ssize_t n = ::read(fd, data.data() + got, max_bytes - got);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const int err = errno;
      ::close(fd);
      return ErrnoStatus("cannot read " + path, err);
    }
    if (n == 0) break;
    got += static_cast<size_t>(n);
  }
  ::close(fd);
  data.resize(got);
  return data;
}

}  // namespace dslaunch::agent
