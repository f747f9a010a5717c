#include "agent/node_facts.h"

#include <arpa/inet.h>  // inet_ntop
#include <ifaddrs.h>    // getifaddrs
#include <net/if.h>     // IFF_LOOPBACK
#include <sched.h>      // sched_getaffinity
#include <unistd.h>     // gethostname, getpid

#include <filesystem>

namespace dslaunch::agent {

std::vector<int> DetectGpus() {
  std::vector<int> gpus;
  std::error_code ec;
  std::filesystem::directory_iterator it("/proc/driver/nvidia/gpus", ec);
  if (ec) return gpus;
  int count = 0;
  for (const auto& entry : it) {
    (void)entry;
    gpus.push_back(count++);
  }
  return gpus;
}

static std::vector<std::string> Addresses() {
  std::vector<std::string> out;
  ifaddrs* list = nullptr;
  if (::getifaddrs(&list) != 0) return out;
  for (ifaddrs* a = list; a; a = a->ifa_next) {
    if (!a->ifa_addr || (a->ifa_flags & IFF_LOOPBACK)) continue;
    char buf[INET6_ADDRSTRLEN] = {0};
    const int family = a->ifa_addr->sa_family;
    if (family == AF_INET) {
      ::inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(a->ifa_addr)->sin_addr,
                  buf, sizeof(buf));
    } else if (family == AF_INET6) {
      ::inet_ntop(AF_INET6,
                  &reinterpret_cast<sockaddr_in6*>(a->ifa_addr)->sin6_addr, buf,
                  sizeof(buf));
    } else {
      continue;
    }
    out.emplace_back(buf);
  }
  ::freeifaddrs(list);
  return out;
}

wire::NodeFacts CollectNodeFacts() {
  wire::NodeFacts facts;
  char host[256] = {0};
  ::gethostname(host, sizeof(host) - 1);
  facts.set_hostname(host);
  for (auto& a : Addresses()) facts.add_addresses(a);
  cpu_set_t set;
  CPU_ZERO(&set);
  facts.set_cpu_cores(::sched_getaffinity(0, sizeof(set), &set) == 0
                          ? CPU_COUNT(&set)
                          : static_cast<int>(::sysconf(_SC_NPROCESSORS_ONLN)));
  for (int g : DetectGpus()) facts.add_gpus(g);
  facts.set_agent_pid(::getpid());
  return facts;
}

}  // namespace dslaunch::agent
