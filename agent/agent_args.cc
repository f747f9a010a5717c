#include "agent/agent_args.h"

#include <unistd.h>  // read, environ

#include <cerrno>
#include <cstdlib>  // getenv, unsetenv
#include <cstring>  // memset, strlen, strncmp
#include <string_view>

#include "base/host_info.h"

namespace dslaunch::agent {

Status ParseConnect(const std::string& connect, std::string* host, int* port) {
  Status st = base::SplitHostPort(connect, host, port);
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

// "123" into 123 when it is 1 to 5 digits, else nullopt.
static std::optional<int> SmallNumber(std::string_view s) {
  if (s.empty() || s.size() > 5) return std::nullopt;
  int v = 0;
  for (char c : s) {
    if (c < '0' || c > '9') return std::nullopt;
    v = v * 10 + (c - '0');
  }
  return v;
}

StatusOr<int> JoinNodeRank(std::optional<int> flag,
                           const char* job_completion_index,
                           const std::string& hostname, std::string* said) {
  if (flag) {
    *said = "--node_rank";
    return *flag;
  }
  if (job_completion_index != nullptr && *job_completion_index != '\0') {
    const auto index = SmallNumber(job_completion_index);
    if (!index || *index > 65535) {
      return InvalidArgument(std::string("JOB_COMPLETION_INDEX '") +
                             job_completion_index +
                             "' is not a node rank (0-65535)");
    }
    *said = "JOB_COMPLETION_INDEX";
    return *index;
  }
  const size_t dash = hostname.rfind('-');
  if (dash != std::string::npos) {
    const auto n = SmallNumber(std::string_view(hostname).substr(dash + 1));
    if (n && *n <= 65535) {
      *said = "the hostname " + hostname;
      return *n;
    }
  }
  *said = "none given: the first free";
  return -1;
}

StatusOr<std::string> TakeVariable(const std::string& name) {
  const char* value = std::getenv(name.c_str());
  if (value == nullptr || *value == '\0')
    return InvalidArgument(name + ": not set on this node");
  std::string out = value;
  const std::string prefix = name + "=";
  for (char** e = environ; *e != nullptr; ++e) {
    if (std::strncmp(*e, prefix.c_str(), prefix.size()) == 0)
      std::memset(*e + prefix.size(), 'x', std::strlen(*e) - prefix.size());
  }
  ::unsetenv(name.c_str());
  return out;
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
