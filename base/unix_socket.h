// Small blocking helpers for Unix stream sockets and file descriptors, used
// by the clients that ranks link (progress, store). Any thread.
#pragma once

#include <string>
#include <string_view>

#include "base/status.h"

namespace dslaunch::base {

// Connects a blocking, close-on-exec Unix stream socket to `path`.
StatusOr<int> ConnectUnixSocket(const std::string& path);
// Writes all of `data`, retrying on EINTR and short writes.
Status WriteAll(int fd, std::string_view data);
// Reads exactly `n` bytes; Unavailable on end of stream.
Status ReadExact(int fd, size_t n, std::string* out);

}  // namespace dslaunch::base
