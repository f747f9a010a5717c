// Facts about this machine and small helpers for freshly forked children,
// shared by the launcher and the agent. Any thread; the child helpers only
// between fork and exec (they make async-signal-safe calls only).
#pragma once

#include <string>
#include <vector>

namespace dslaunch::proto {

// Numeric addresses of this machine's interfaces (IPv4 and IPv6).
std::vector<std::string> InterfaceAddresses(bool include_loopback);

// In a child after fork: default dispositions for every signal, an empty
// signal mask, and close-on-exec for every descriptor above 2, so nothing
// of the parent's (sockets, listeners, pipes) leaks into the new program.
void PrepareChildForExec();

}  // namespace dslaunch::proto
