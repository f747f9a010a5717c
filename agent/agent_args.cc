#include "agent/agent_args.h"

#include <unistd.h>  // read

#include <cerrno>
#include <charconv>

namespace dslaunch::agent {

Status ParseConnect(const std::string& connect, std::string* host, int* port) {
  const std::string bad = "--connect '" + connect + "': expected HOST:PORT";
  const size_t colon = connect.rfind(':');
  if (colon == std::string::npos || colon == 0) return InvalidArgument(bad);
  std::string h = connect.substr(0, colon);
  if (h.front() == '[') {
    if (h.size() < 3 || h.back() != ']') return InvalidArgument(bad);
    h = h.substr(1, h.size() - 2);
  }
  const char* first = connect.data() + colon + 1;
  const char* last = connect.data() + connect.size();
  int p = 0;
  const auto [end, ec] = std::from_chars(first, last, p);
  if (ec != std::errc() || end != last || p < 1 || p > 65535) {
    return InvalidArgument(bad + " with a port in 1-65535");
  }
  *host = std::move(h);
  *port = p;
  return Status::Ok();
}

StatusOr<int> NodeRankInHosts(const std::string& hosts, const std::string& me) {
  size_t start = 0;
  for (int i = 0; start <= hosts.size(); ++i) {
    size_t end = hosts.find(',', start);
    if (end == std::string::npos) end = hosts.size();
    if (hosts.compare(start, end - start, me) == 0) return i;
    start = end + 1;
  }
  return InvalidArgument("--node_host " + me + " is not in --hosts");
}

bool ReadSecretLine(int fd, std::string* out) {
  char c;
  while (true) {
    const ssize_t n = ::read(fd, &c, 1);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return !out->empty();
    if (c == '\n') return true;
    if (out->size() >= 4096) return false;
    out->push_back(c);
  }
}

}  // namespace dslaunch::agent
