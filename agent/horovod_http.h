// The pure parts of the Horovod rendezvous (horovod_rendezvous.h): reading
// an HTTP request head as horovodrun's server takes it, and finding who owns
// a loopback TCP connection in /proc/net/tcp. No I/O; any thread.
#pragma once

#include <sys/types.h>  // uid_t

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "base/status.h"

namespace dslaunch::agent {

inline constexpr size_t kHorovodMaxHeadBytes = 8 << 10;
inline constexpr size_t kHorovodMaxBodyBytes = 64 << 10;

// One parsed request, or why it is refused (status != 200).
struct HttpRequest {
  int status = 200;  // 400, 405, 411, 413, 431, 501 when refused
  std::string why;   // the refusal's reason, sent as the body
  std::string method;
  std::string scope;
  std::string key;
  size_t content_length = 0;
};

// Parses a request head (request line and headers, through the blank line).
HttpRequest ParseHorovodRequestHead(std::string_view head);

// The uid owning the TCP socket 127.0.0.1:`peer_port` connected to
// 127.0.0.1:`local_port`, from `proc_net_tcp` (the text of /proc/net/tcp).
// NotFound when no such socket is listed.
StatusOr<uid_t> LoopbackPeerUid(std::string_view proc_net_tcp,
                                uint16_t local_port, uint16_t peer_port);

}  // namespace dslaunch::agent
