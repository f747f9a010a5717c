// What an agent tells the launcher about its node when it registers:
// hostname, addresses, usable CPU cores, GPUs by index. Reads the OS;
// any thread.
#pragma once

#include <vector>

#include "proto/dslaunch.pb.h"

namespace dslaunch::agent {

wire::NodeFacts CollectNodeFacts();
// GPU indices from /proc/driver/nvidia/gpus (empty without the driver).
std::vector<int> DetectGpus();

}  // namespace dslaunch::agent
