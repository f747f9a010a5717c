// NodeExits: for start modes whose one tool process starts every node's
// agent (pdsh, srun). It reports each node's agent's end to the Starter's
// delegate exactly once: as the tool's output names it, or, when the tool
// itself ends, every node not reported yet as ended with it. io_context
// thread only.
#pragma once

#include <string>
#include <vector>

#include "launcher/start/starter.h"
#include "proto/process_set.h"  // ExitInfo

namespace dslaunch::launcher {

class NodeExits {
 public:
  NodeExits(Starter::Delegate* delegate, std::string tool, size_t nodes);
  // Node `node`'s agent ended (`how`, in the tool's words); once per node,
  // a node out of range is ignored.
  void Ended(int node, const std::string& how);
  // The tool ended: "ended with <tool>, which ..." for every node left.
  void ToolEnded(const proto::ExitInfo& info);

 private:
  Starter::Delegate* delegate_;
  std::string tool_;
  std::vector<bool> ended_;
};

}  // namespace dslaunch::launcher
