#include "agent/node_facts.h"

#include <sched.h>   // sched_getaffinity
#include <unistd.h>  // gethostname, getpid

#include <filesystem>

#include "proto/host_info.h"

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

wire::NodeFacts CollectNodeFacts() {
  wire::NodeFacts facts;
  char host[256] = {0};
  ::gethostname(host, sizeof(host) - 1);
  facts.set_hostname(host);
  for (auto& a : proto::InterfaceAddresses(false)) facts.add_addresses(a);
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
