#include "agent/host_check.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <unistd.h>

#include <algorithm>

namespace dslaunch::agent {

namespace {

bool IsLoopback(const std::string& address) {
  in_addr v4{};
  if (::inet_pton(AF_INET, address.c_str(), &v4) == 1)
    return (ntohl(v4.s_addr) >> 24) == 127;
  in6_addr v6{};
  if (::inet_pton(AF_INET6, address.c_str(), &v6) == 1)
    return IN6_IS_ADDR_LOOPBACK(&v6);
  return false;
}

}  // namespace

std::vector<std::string> HostWarnings(
    const std::string& hostname, const std::vector<std::string>& addresses) {
  std::vector<std::string> loopback;
  for (const auto& a : addresses) {
    if (IsLoopback(a) &&
        std::find(loopback.begin(), loopback.end(), a) == loopback.end())
      loopback.push_back(a);
  }
  if (loopback.empty()) return {};
  std::string list;
  for (const auto& a : loopback) list += (list.empty() ? "" : ", ") + a;
  return {"hostname '" + hostname + "' resolves to " + list +
          " (loopback): programs that take the hostname as this node's "
          "address (Gloo, NCCL, MASTER_ADDR=$(hostname)) reach only this "
          "node; dslaunch gives each rank GLOO_SOCKET_IFNAME and "
          "NCCL_SOCKET_IFNAME toward MASTER_ADDR, but fix /etc/hosts to map "
          "the hostname to the node's network address"};
}

std::vector<std::string> SystemHostWarnings() {
  char name[256] = {0};
  if (::gethostname(name, sizeof(name) - 1) != 0) return {};
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  if (::getaddrinfo(name, nullptr, &hints, &found) != 0) {
    return {"hostname '" + std::string(name) +
            "' does not resolve: tools that look up this node by name fail"};
  }
  std::vector<std::string> addresses;
  for (addrinfo* a = found; a != nullptr; a = a->ai_next) {
    char text[INET6_ADDRSTRLEN] = {0};
    const void* where =
        a->ai_family == AF_INET
            ? static_cast<const void*>(
                  &reinterpret_cast<sockaddr_in*>(a->ai_addr)->sin_addr)
            : static_cast<const void*>(
                  &reinterpret_cast<sockaddr_in6*>(a->ai_addr)->sin6_addr);
    if (::inet_ntop(a->ai_family, where, text, sizeof(text)))
      addresses.push_back(text);
  }
  ::freeaddrinfo(found);
  return HostWarnings(name, addresses);
}

}  // namespace dslaunch::agent
