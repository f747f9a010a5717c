#include "base/unix_socket.h"

#include <sys/socket.h>  // socket, connect
#include <sys/un.h>      // sockaddr_un
#include <unistd.h>      // read, write, close

#include <cerrno>
#include <cstring>

namespace dslaunch::base {

StatusOr<int> ConnectUnixSocket(const std::string& path) {
  sockaddr_un addr{};
  if (path.empty() || path.size() >= sizeof(addr.sun_path)) {
    return InvalidArgument("bad Unix socket path '" + path + "'");
  }
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, path.data(), path.size());
  int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return ErrnoStatus("socket", errno);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    int err = errno;
    ::close(fd);
    return Status(StatusCode::kUnavailable,
                  "connect to " + path + ": " + std::strerror(err));
  }
  return fd;
}

Status WriteAll(int fd, std::string_view data) {
  while (!data.empty()) {
    ssize_t n = ::send(fd, data.data(), data.size(), MSG_NOSIGNAL);
    if (n < 0 && errno == ENOTSOCK) n = ::write(fd, data.data(), data.size());
    if (n < 0) {
      if (errno == EINTR) continue;
      return Status(StatusCode::kUnavailable,
                    std::string("write: ") + std::strerror(errno));
    }
    data.remove_prefix(static_cast<size_t>(n));
  }
  return Status::Ok();
}

Status ReadExact(int fd, size_t n, std::string* out) {
  out->resize(n);
  size_t got = 0;
  while (got < n) {
    ssize_t r = ::read(fd, out->data() + got, n - got);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) return ErrnoStatus("read", errno);
    if (r == 0) return Unavailable("connection closed");
    got += static_cast<size_t>(r);
  }
  return Status::Ok();
}

}  // namespace dslaunch::base
