// Where the launcher's control server listens, and whether a host is this
// machine. ChooseControlAddresses is pure: the lookups it needs come in an
// AddressLookup (System() for the real ones, fakes in tests). Any thread.
#pragma once

#include <functional>
#include <string>
#include <vector>

namespace dslaunch::launcher {

// True when `host` names this machine: a loopback address (all of
// 127.0.0.0/8 and ::1), "localhost", or an address of a local interface.
bool IsLocalHost(const std::string& host);

struct AddressLookup {
  std::function<bool(const std::string& host)> is_local;
  // This machine's source address toward `host`; "" when it cannot tell.
  std::function<std::string(const std::string& host)> route_from;
  // Every address `host` resolves to (a numeric address: itself).
  std::function<std::vector<std::string>(const std::string& host)> resolve;
  // IsLocalHost, base::RouteTo and getaddrinfo.
  static AddressLookup System();
};

// The warning for a --master_addr that is not node 0 (DeepSpeed's ranks
// rendezvous there, so a typo hangs them): "" when `master_addr` resolves to
// one of node 0's addresses (its name's, or the one it connected from).
std::string MasterAddrWarning(const std::string& master_addr,
                              const std::string& node0_host,
                              const std::string& node0_peer,
                              const AddressLookup& lookup);

// The addresses the control server binds (all on one port), in this order:
// - `bind_addr` when given: exactly that (an explicit choice wins);
// - else `control_addr` when given (what agents dial): that address when it
//   is a numeric address of this machine, else the wildcard of its family
//   (it may be a name or a NAT'd address that only the agents' side knows);
// - else, per node, the source address the kernel would use toward it, plus
//   127.0.0.1 when any node is this machine (local agents dial loopback);
//   a loopback-only plan thus listens on loopback only. A node whose route
//   is unknown (does not resolve) falls back to the wildcard 0.0.0.0: the
//   start then names that node.
// Duplicates removed, first occurrence kept.
std::vector<std::string> ChooseControlAddresses(
    const std::vector<std::string>& hosts, const std::string& bind_addr,
    const std::string& control_addr, const AddressLookup& lookup);

}  // namespace dslaunch::launcher
