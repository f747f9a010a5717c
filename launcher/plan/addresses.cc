#include "launcher/plan/addresses.h"

#include <arpa/inet.h>   // inet_pton
#include <netdb.h>       // getaddrinfo
#include <netinet/in.h>  // IN6_IS_ADDR_LOOPBACK

#include <algorithm>
#include <set>

#include "base/host_info.h"

namespace dslaunch::launcher {

static bool IsLoopback(const sockaddr* a) {
  if (a->sa_family == AF_INET) {
    const auto* sin = reinterpret_cast<const sockaddr_in*>(a);
    return (ntohl(sin->sin_addr.s_addr) >> 24) == 127;
  }
  if (a->sa_family == AF_INET6) {
    const auto* sin6 = reinterpret_cast<const sockaddr_in6*>(a);
    return IN6_IS_ADDR_LOOPBACK(&sin6->sin6_addr);
  }
  return false;
}

// This machine's addresses, asked for once (a netlink dump costs about a
// millisecond on a host with many interfaces, and planning asks per node).
static const std::set<std::string>& LocalAddresses() {
  static const std::set<std::string> local = [] {
    const auto addresses = base::InterfaceAddresses(true);
    return std::set<std::string>(addresses.begin(), addresses.end());
  }();
  return local;
}

bool IsLocalHost(const std::string& host) {
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  if (::getaddrinfo(host.c_str(), nullptr, &hints, &res) != 0) return false;
  bool is_local = false;
  for (addrinfo* r = res; r && !is_local; r = r->ai_next)
    is_local = IsLoopback(r->ai_addr);
  if (!is_local) {  // only then ask for the interfaces
    const std::set<std::string>& local = LocalAddresses();
    for (addrinfo* r = res; r && !is_local; r = r->ai_next)
      is_local = local.count(base::AddressToString(r->ai_addr)) > 0;
  }
  ::freeaddrinfo(res);
  return is_local;
}

static std::vector<std::string> ResolveAll(const std::string& host) {
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  std::vector<std::string> out;
  if (::getaddrinfo(host.c_str(), nullptr, &hints, &res) != 0) return out;
  for (addrinfo* r = res; r; r = r->ai_next)
    out.push_back(base::AddressToString(r->ai_addr));
  ::freeaddrinfo(res);
  return out;
}

AddressLookup AddressLookup::System() {
  return AddressLookup{
      .is_local = IsLocalHost,
      .route_from =
          [](const std::string& host) {
            auto route = base::RouteTo(host);
            return route.ok() ? route->local : std::string();
          },
      .resolve = ResolveAll,
  };
}

std::string MasterAddrWarning(const std::string& master_addr,
                              const std::string& node0_host,
                              const std::string& node0_peer,
                              const AddressLookup& lookup) {
  if (master_addr.empty() || master_addr == node0_host) return "";
  std::set<std::string> node0;
  for (const auto& a : lookup.resolve(node0_host)) node0.insert(a);
  if (!node0_peer.empty()) node0.insert(node0_peer);
  const std::vector<std::string> given = lookup.resolve(master_addr);
  for (const auto& a : given) {
    if (node0.count(a)) return "";
  }
  const std::string where =
      node0_host +
      (node0_peer.empty() || node0_peer == node0_host ? "" : ", " + node0_peer);
  return "warning: --master_addr " + master_addr +
         (given.empty() ? " does not resolve here and" : "") +
         " is not node 0 (" + where +
         "): the ranks will rendezvous there, and hang if nothing listens";
}

// Whether `text` is a numeric IPv4 (family AF_INET) or IPv6 address.
static int NumericFamily(const std::string& text) {
  unsigned char buf[sizeof(in6_addr)];
  if (::inet_pton(AF_INET, text.c_str(), buf) == 1) return AF_INET;
  if (::inet_pton(AF_INET6, text.c_str(), buf) == 1) return AF_INET6;
  return 0;
}

static void AddUnique(std::vector<std::string>* out, const std::string& a) {
  if (std::find(out->begin(), out->end(), a) == out->end()) out->push_back(a);
}

std::vector<std::string> ChooseControlAddresses(
    const std::vector<std::string>& hosts, const std::string& bind_addr,
    const std::string& control_addr, const AddressLookup& lookup) {
  if (!bind_addr.empty()) return {bind_addr};
  if (!control_addr.empty()) {
    const int family = NumericFamily(control_addr);
    if (family != 0 && lookup.is_local(control_addr)) return {control_addr};
    return {family == AF_INET6 ? "::" : "0.0.0.0"};
  }
  std::vector<std::string> out;
  bool any_local = false;
  for (const std::string& host : hosts) {
    const std::string from = lookup.route_from(host);
    if (from.empty()) return {"0.0.0.0"};
    AddUnique(&out, from);
    any_local = any_local || lookup.is_local(host);
  }
  if (any_local) out.insert(out.begin(), "127.0.0.1");
  // The insert may have duplicated an address already there.
  std::vector<std::string> unique;
  for (const auto& a : out) AddUnique(&unique, a);
  return unique;
}

}  // namespace dslaunch::launcher
