#include "agent/agent_args.h"

#include <unistd.h>  // read

#include <cerrno>

#include "proto/host_info.h"

namespace dslaunch::agent {

Status ParseConnect(const std::string& connect, std::string* host, int* port) {
  Status st = proto::SplitHostPort(connect, host, port);
  if (!st.ok()) return InvalidArgument("--connect " + st.message());
  return st;
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
