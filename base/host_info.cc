#include "base/host_info.h"

#include <arpa/inet.h>          // inet_ntop
#include <fcntl.h>              // fcntl
#include <ifaddrs.h>            // getifaddrs
#include <linux/close_range.h>  // CLOSE_RANGE_CLOEXEC
#include <net/if.h>             // IFF_LOOPBACK
#include <netdb.h>              // getaddrinfo
#include <sched.h>              // sched_getaffinity
#include <signal.h>             // sigprocmask, signal
#include <sys/resource.h>       // getrlimit
#include <unistd.h>

#include <cerrno>  // close_range, close
#include <charconv>
#include <fstream>
#include <set>
#include <string_view>

namespace dslaunch::base {

std::string AddressToString(const sockaddr* addr) {
  char buf[INET6_ADDRSTRLEN] = {0};
  if (addr->sa_family == AF_INET) {
    ::inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in*>(addr)->sin_addr,
                buf, sizeof(buf));
  } else if (addr->sa_family == AF_INET6) {
    ::inet_ntop(AF_INET6,
                &reinterpret_cast<const sockaddr_in6*>(addr)->sin6_addr, buf,
                sizeof(buf));
  }
  return buf;
}

std::string InterfaceWithAddress(const std::string& address) {
  ifaddrs* list = nullptr;
  if (address.empty() || ::getifaddrs(&list) != 0) return "";
  std::string name;
  for (ifaddrs* a = list; a && name.empty(); a = a->ifa_next) {
    if (a->ifa_addr && a->ifa_name && AddressToString(a->ifa_addr) == address)
      name = a->ifa_name;
  }
  ::freeifaddrs(list);
  return name;
}

std::string LocalHostname() {
  char host[256] = {0};
  if (::gethostname(host, sizeof(host) - 1) != 0) return "";
  return host;
}

std::vector<std::string> InterfaceAddresses(bool include_loopback) {
  std::vector<std::string> out;
  ifaddrs* list = nullptr;
  if (::getifaddrs(&list) != 0) return out;
  for (ifaddrs* a = list; a; a = a->ifa_next) {
    if (!a->ifa_addr) continue;
    if (!include_loopback && (a->ifa_flags & IFF_LOOPBACK)) continue;
    std::string text = AddressToString(a->ifa_addr);
    if (!text.empty()) out.push_back(std::move(text));
  }
  ::freeifaddrs(list);
  return out;
}

std::string JoinHostPort(const std::string& host, int port) {
  const bool ipv6 = host.find(':') != std::string::npos;
  return (ipv6 ? "[" + host + "]" : host) + ":" + std::to_string(port);
}

Status SplitHostPort(const std::string& text, std::string* host, int* port) {
  const Status bad = InvalidArgument("'" + text + "': expected HOST:PORT");
  const size_t colon = text.rfind(':');
  if (colon == std::string::npos || colon == 0) return bad;
  std::string h = text.substr(0, colon);
  if (h.front() == '[') {
    if (h.size() < 3 || h.back() != ']') return bad;
    h = h.substr(1, h.size() - 2);
  }
  const char* first = text.data() + colon + 1;
  const char* last = text.data() + text.size();
  int p = 0;
  const auto [end, ec] = std::from_chars(first, last, p);
  if (ec != std::errc() || end != last || p < 1 || p > 65535) {
    return InvalidArgument("'" + text +
                           "': expected HOST:PORT with a port in 1-65535");
  }
  *host = std::move(h);
  *port = p;
  return Status::Ok();
}

StatusOr<Route> RouteTo(const std::string& host) {
  addrinfo hints{};
  hints.ai_socktype = SOCK_DGRAM;
  addrinfo* res = nullptr;
  if (int rc = ::getaddrinfo(host.c_str(), "9", &hints, &res); rc != 0) {
    return NotFound("cannot resolve " + host + ": " + ::gai_strerror(rc));
  }
  Route route;
  route.peer = AddressToString(res->ai_addr);
  const int fd = ::socket(res->ai_family, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  sockaddr_storage a{};
  socklen_t len = sizeof(a);
  const bool ok = fd >= 0 &&
                  ::connect(fd, res->ai_addr, res->ai_addrlen) == 0 &&
                  ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0;
  if (fd >= 0) ::close(fd);
  ::freeaddrinfo(res);
  if (!ok) return Unavailable("no route to " + host);
  route.local = AddressToString(reinterpret_cast<sockaddr*>(&a));
  return route;
}

void EnsureStandardDescriptors() {
  for (int fd = 0; fd <= 2; ++fd) {
    if (::fcntl(fd, F_GETFD) == -1 && errno == EBADF) {
      // open() returns the lowest free descriptor: this one.
      (void)::open("/dev/null", fd == 0 ? O_RDONLY : O_WRONLY);
    }
  }
}

DSL_NO_ASAN void PrepareChildForExec() {
  // Default dispositions first, then unblock: a signal pending since the
  // fork (the parent blocks all around it) must not run its handlers here.
  for (int sig = 1; sig < NSIG; ++sig) ::signal(sig, SIG_DFL);
  sigset_t none;
  sigemptyset(&none);
  ::sigprocmask(SIG_SETMASK, &none, nullptr);
  if (::close_range(3, ~0U, CLOSE_RANGE_CLOEXEC) != 0) {
    // Kernels before 5.11: mark each descriptor (async-signal-safe calls).
    rlimit lim{};
    const int max_fd =
        ::getrlimit(RLIMIT_NOFILE, &lim) == 0 && lim.rlim_cur < 65536
            ? static_cast<int>(lim.rlim_cur)
            : 65536;
    for (int fd = 3; fd < max_fd; ++fd) ::fcntl(fd, F_SETFD, FD_CLOEXEC);
  }
}

StatusOr<std::vector<int>> ParseCpuList(const std::string& text) {
  std::vector<int> cpus;
  std::set<int> seen;
  auto number = [](std::string_view s, int* out) {
    if (s.empty() || s.size() > 4) return false;
    int v = 0;
    for (char c : s) {
      if (c < '0' || c > '9') return false;
      v = v * 10 + (c - '0');
    }
    *out = v;
    return v < kMaxCpu;
  };
  size_t start = 0;
  while (start <= text.size()) {
    size_t end = text.find(',', start);
    if (end == std::string::npos) end = text.size();
    const std::string_view part(text.data() + start, end - start);
    const size_t dash = part.find('-');
    int lo = 0, hi = 0;
    const bool ok = dash == std::string_view::npos
                        ? number(part, &lo) && number(part, &hi)
                        : number(part.substr(0, dash), &lo) &&
                              number(part.substr(dash + 1), &hi) && lo <= hi;
    if (!ok) {
      return InvalidArgument("'" + std::string(part) +
                             "' is not a CPU or a range lo-hi of CPUs below " +
                             std::to_string(kMaxCpu));
    }
    for (int cpu = lo; cpu <= hi; ++cpu) {
      if (!seen.insert(cpu).second)
        return InvalidArgument("CPU " + std::to_string(cpu) + " given twice");
      cpus.push_back(cpu);
    }
    start = end + 1;
  }
  return cpus;
}

std::string CpuListString(const std::vector<int>& cpus) {
  std::string out;
  for (size_t i = 0; i < cpus.size();) {
    size_t j = i;
    while (j + 1 < cpus.size() && cpus[j + 1] == cpus[j] + 1) ++j;
    if (!out.empty()) out += ",";
    out += std::to_string(cpus[i]);
    if (j > i) out += "-" + std::to_string(cpus[j]);
    i = j + 1;
  }
  return out;
}

std::vector<int> UsableCores() {
  cpu_set_t mask;
  CPU_ZERO(&mask);
  std::vector<int> cores;
  if (::sched_getaffinity(0, sizeof(mask), &mask) != 0) return cores;
  std::set<std::pair<int, int>> seen_cores;  // {package, core}
  for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu) {
    if (!CPU_ISSET(cpu, &mask)) continue;
    const std::string topo =
        "/sys/devices/system/cpu/cpu" + std::to_string(cpu) + "/topology/";
    int package = -1, core = -1;
    std::ifstream(topo + "physical_package_id") >> package;
    std::ifstream(topo + "core_id") >> core;
    if (package >= 0 && core >= 0 && !seen_cores.insert({package, core}).second)
      continue;  // a second hardware thread of a core already taken
    cores.push_back(cpu);
  }
  return cores;
}

}  // namespace dslaunch::base
