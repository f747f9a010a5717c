#include "proto/host_info.h"

#include <arpa/inet.h>          // inet_ntop
#include <fcntl.h>              // fcntl
#include <ifaddrs.h>            // getifaddrs
#include <linux/close_range.h>  // CLOSE_RANGE_CLOEXEC
#include <net/if.h>             // IFF_LOOPBACK
#include <signal.h>             // sigprocmask, signal
#include <sys/resource.h>       // getrlimit
#include <unistd.h>             // close_range

namespace dslaunch::proto {

std::vector<std::string> InterfaceAddresses(bool include_loopback) {
  std::vector<std::string> out;
  ifaddrs* list = nullptr;
  if (::getifaddrs(&list) != 0) return out;
  for (ifaddrs* a = list; a; a = a->ifa_next) {
    if (!a->ifa_addr) continue;
    if (!include_loopback && (a->ifa_flags & IFF_LOOPBACK)) continue;
    char buf[INET6_ADDRSTRLEN] = {0};
    const void* addr = nullptr;
    const int family = a->ifa_addr->sa_family;
    if (family == AF_INET) {
      addr = &reinterpret_cast<sockaddr_in*>(a->ifa_addr)->sin_addr;
    } else if (family == AF_INET6) {
      addr = &reinterpret_cast<sockaddr_in6*>(a->ifa_addr)->sin6_addr;
    } else {
      continue;
    }
    ::inet_ntop(family, addr, buf, sizeof(buf));
    out.emplace_back(buf);
  }
  ::freeifaddrs(list);
  return out;
}

void PrepareChildForExec() {
  sigset_t none;
  sigemptyset(&none);
  ::sigprocmask(SIG_SETMASK, &none, nullptr);
  for (int sig = 1; sig < NSIG; ++sig) ::signal(sig, SIG_DFL);
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

}  // namespace dslaunch::proto
