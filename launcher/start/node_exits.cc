#include "launcher/start/node_exits.h"

#include <spdlog/spdlog.h>

#include "proto/exit_status.h"

namespace dslaunch::launcher {

NodeExits::NodeExits(Starter::Delegate* delegate, std::string tool,
                     size_t nodes)
    : delegate_(delegate), tool_(std::move(tool)), ended_(nodes, false) {}

void NodeExits::Ended(int node, const std::string& how) {
  if (node < 0 || static_cast<size_t>(node) >= ended_.size() || ended_[node])
    return;
  ended_[node] = true;
  delegate_->OnAgentProcessExited(node, how);
}

void NodeExits::ToolEnded(const proto::ExitInfo& info) {
  if (!info.error.empty())
    spdlog::error("cannot start {}: {}", tool_, info.error);
  const std::string how =
      "ended with " + tool_ + ", which " +
      (info.error.empty() ? DescribeWaitStatus(info.wait_status) : info.error);
  for (size_t n = 0; n < ended_.size(); ++n) Ended(static_cast<int>(n), how);
}

}  // namespace dslaunch::launcher
