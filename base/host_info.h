// Facts about this machine, the one set of address helpers (formatting,
// parsing "host:port", routes), and small helpers for freshly forked
// children, shared by the launcher and the agent. Any thread; the child
// helpers only between fork and exec (they make async-signal-safe calls only).
#pragma once

#include <sys/socket.h>  // sockaddr

#include <string>
#include <vector>

#include "base/status.h"

namespace dslaunch::base {

// The name of this machine's interface holding `address` ("10.0.0.7",
// "fe80::1"), or "".
std::string InterfaceWithAddress(const std::string& address);

// This machine's hostname (gethostname), "" when it has none.
std::string LocalHostname();

// Numeric addresses of this machine's interfaces (IPv4 and IPv6).
std::vector<std::string> InterfaceAddresses(bool include_loopback);

// The numeric form of an AF_INET or AF_INET6 address; "" for other families.
std::string AddressToString(const sockaddr* addr);

// "host:port", with an IPv6 literal in brackets ("[::1]:29400").
std::string JoinHostPort(const std::string& host, int port);
// The inverse: "HOST:PORT" or "[IPV6]:PORT" into host (brackets removed) and
// port (1-65535). InvalidArgument otherwise; the outputs are untouched then.
Status SplitHostPort(const std::string& text, std::string* host, int* port);

// The addresses a connection from here to `host` would use: this machine's
// source address (`local`) and the node's (`peer`), found by connecting an
// unsent UDP socket (no packet leaves). NotFound when `host` does not
// resolve, Unavailable when there is no route.
struct Route {
  std::string local;
  std::string peer;
};
StatusOr<Route> RouteTo(const std::string& host);

// CPU lists as Linux writes them ("1,3-5,7"). ParseCpuList refuses anything
// else (InvalidArgument naming the bad part), CPUs at or above kMaxCpu and
// repeats; CpuListString writes ranges for runs of consecutive numbers.
inline constexpr int kMaxCpu = 1024;  // glibc's CPU_SETSIZE
StatusOr<std::vector<int>> ParseCpuList(const std::string& text);
std::string CpuListString(const std::vector<int>& cpus);
// The CPUs this process may run on, one per physical core (the first
// hardware thread of each, as /sys describes the topology; all of them
// where it does not), in ascending order.
std::vector<int> UsableCores();

// At a program's start: descriptors 0-2 that are closed become /dev/null,
// so that no pipe or socket opened later lands on them.
void EnsureStandardDescriptors();

// Code that runs in a child started with CLONE_VM (sharing the parent's
// memory until exec, on a stack AddressSanitizer does not know) carries no
// stack instrumentation.
#if defined(__SANITIZE_ADDRESS__)
#define DSL_NO_ASAN __attribute__((no_sanitize_address))
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define DSL_NO_ASAN __attribute__((no_sanitize_address))
#endif
#endif
#ifndef DSL_NO_ASAN
#define DSL_NO_ASAN
#endif

// In a child before exec (forked, or sharing our memory): default
// dispositions for every signal, an empty signal mask, and close-on-exec
// for every descriptor above 2, so nothing of the parent's (sockets,
// listeners, pipes) leaks into the new program. Writes nothing but its own
// stack.
DSL_NO_ASAN void PrepareChildForExec();

}  // namespace dslaunch::base
