#include "launcher/local_starter.h"

#include <arpa/inet.h>  // inet_ntop
#include <netdb.h>      // getaddrinfo
#include <signal.h>     // SIGKILL, SIGTERM
#include <spdlog/spdlog.h>

#include <set>

#include "launcher/report.h"
#include "proto/host_info.h"
#include "proto/unix_socket.h"

namespace dslaunch::launcher {

LocalStarter::LocalStarter(boost::asio::io_context& io,
                           Starter::Delegate* delegate)
    : delegate_(delegate), processes_(io, this) {}

Status LocalStarter::Start(const std::vector<AgentLaunch>& launches,
                           const std::string& secret) {
  for (const auto& launch : launches) {
    proto::ProcessSpec spec;
    spec.argv = launch.argv;
    spec.inherit_env = true;
    spec.new_session = true;
    spec.death_signal = SIGTERM;
    spec.stdin_pipe = true;
    spec.capture_output = false;  // the agent logs to our stderr
    spec.destroy_signal = 0;      // the closed lifeline tells it to go
    ASSIGN_OR_RETURN(pid_t pid, processes_.Spawn(spec));
    node_of_[pid] = launch.node_rank;
    // A pipe holds 64 KiB, so this never blocks; a dead agent gives EPIPE.
    (void)proto::WriteAll(processes_.StdinOf(pid), secret + "\n");
  }
  return Status::Ok();
}

void LocalStarter::Kill(int node_rank) {
  for (const auto& [pid, node] : node_of_) {
    if (node == node_rank) processes_.Signal(pid, SIGKILL);
  }
}

void LocalStarter::OnProcessExited(pid_t pid, const proto::ExitInfo& info) {
  const int node = node_of_[pid];
  node_of_.erase(pid);
  if (!info.error.empty()) {
    spdlog::error("node {}: cannot start the agent: {}", node, info.error);
  }
  delegate_->OnAgentProcessExited(node, DescribeWaitStatus(info.wait_status));
}

bool IsLocalHost(const std::string& host) {
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  if (::getaddrinfo(host.c_str(), nullptr, &hints, &res) != 0) return false;
  const auto addresses = proto::InterfaceAddresses(true);
  const std::set<std::string> local(addresses.begin(), addresses.end());
  bool is_local = false;
  for (addrinfo* r = res; r && !is_local; r = r->ai_next) {
    char buf[INET6_ADDRSTRLEN] = {0};
    if (r->ai_family == AF_INET) {
      auto* sin = reinterpret_cast<sockaddr_in*>(r->ai_addr);
      if ((ntohl(sin->sin_addr.s_addr) >> 24) == 127) is_local = true;
      ::inet_ntop(AF_INET, &sin->sin_addr, buf, sizeof(buf));
    } else if (r->ai_family == AF_INET6) {
      auto* sin6 = reinterpret_cast<sockaddr_in6*>(r->ai_addr);
      if (IN6_IS_ADDR_LOOPBACK(&sin6->sin6_addr)) is_local = true;
      ::inet_ntop(AF_INET6, &sin6->sin6_addr, buf, sizeof(buf));
    }
    if (local.count(buf)) is_local = true;
  }
  ::freeaddrinfo(res);
  return is_local;
}

}  // namespace dslaunch::launcher
