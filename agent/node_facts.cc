#include "agent/node_facts.h"

#include <arpa/inet.h>   // ntohs
#include <netinet/in.h>  // sockaddr_in6
#include <sched.h>       // sched_getaffinity
#include <sys/socket.h>  // socket, bind, getsockname
#include <unistd.h>      // gethostname, getpid

#include <filesystem>

#include "base/host_info.h"
#include "base/process_tree.h"  // ProcessStartTicks

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

// Binds port 0 on the wildcard address of `family` and returns the port the
// kernel chose (0 on failure). IPv6's wildcard is dual-stack.
static int FreePortOf(int family) {
  const int fd = ::socket(family, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return 0;
  sockaddr_storage addr{};
  addr.ss_family = static_cast<sa_family_t>(family);
  socklen_t len =
      family == AF_INET6 ? sizeof(sockaddr_in6) : sizeof(sockaddr_in);
  int port = 0;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), len) == 0 &&
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0) {
    port = ntohs(family == AF_INET6
                     ? reinterpret_cast<sockaddr_in6*>(&addr)->sin6_port
                     : reinterpret_cast<sockaddr_in*>(&addr)->sin_port);
  }
  ::close(fd);
  return port;
}

int FindFreePort() {
  const int port = FreePortOf(AF_INET6);
  return port > 0 ? port : FreePortOf(AF_INET);
}

wire::NodeFacts CollectNodeFacts() {
  wire::NodeFacts facts;
  facts.set_hostname(base::LocalHostname());
  for (auto& a : base::InterfaceAddresses(false)) facts.add_addresses(a);
  cpu_set_t set;
  CPU_ZERO(&set);
  facts.set_cpu_cores(::sched_getaffinity(0, sizeof(set), &set) == 0
                          ? CPU_COUNT(&set)
                          : static_cast<int>(::sysconf(_SC_NPROCESSORS_ONLN)));
  for (int g : DetectGpus()) facts.add_gpus(g);
  facts.set_agent_pid(::getpid());
  facts.set_agent_start_ticks(base::ProcessStartTicks(::getpid()));
  facts.set_free_port(FindFreePort());
  return facts;
}

std::string InterfaceToward(const std::string& host) {
  if (host.empty()) return "";
  auto route = base::RouteTo(host);
  if (!route.ok()) return "";
  return base::InterfaceWithAddress(route->local);
}

}  // namespace dslaunch::agent
