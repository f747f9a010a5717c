// What an agent tells the launcher about its node when it registers:
// hostname, addresses, usable CPU cores, GPUs by index. Reads the OS;
// any thread.
#pragma once

#include <string>
#include <vector>

#include "proto/dslaunch.pb.h"

namespace dslaunch::agent {

wire::NodeFacts CollectNodeFacts();
// GPU indices from /proc/driver/nvidia/gpus (empty without the driver).
std::vector<int> DetectGpus();
// A TCP port free on every address of this node right now (0 if none could
// be found): node 0's becomes MASTER_PORT unless --master_port is given.
int FindFreePort();
// The name of this node's interface that routes to `host` (the one holding
// the source address the kernel picks toward it: eth0, ib0, lo for this
// machine's loopback), or "" when `host` cannot be resolved or routed.
std::string InterfaceToward(const std::string& host);

}  // namespace dslaunch::agent
