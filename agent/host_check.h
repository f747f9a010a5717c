// Checks of a node's setup that `dslaunch doctor` shows: today, whether the
// node's hostname resolves to a loopback address (Debian's 127.0.1.1 line,
// or a container's /etc/hosts), which makes tools that take the hostname as
// the rank's address (Gloo, NCCL, torch's defaults) pick loopback. Pure
// function plus one that asks the system; any thread.
#pragma once

#include <string>
#include <vector>

namespace dslaunch::agent {

// Warnings for `hostname` resolving to `addresses` (numeric IPv4/IPv6).
std::vector<std::string> HostWarnings(
    const std::string& hostname, const std::vector<std::string>& addresses);
// The same for this machine: gethostname() resolved with getaddrinfo().
std::vector<std::string> SystemHostWarnings();

}  // namespace dslaunch::agent
