#include "launcher/start/secret_relay.h"

#include <spdlog/spdlog.h>

#include "proto/secret_line.h"

namespace dslaunch::launcher {

bool RelaySecretLine(Starter::Delegate* delegate, const std::string& tool,
                     std::string_view line, size_t nodes,
                     std::optional<int> from_node) {
  if (!proto::HasSecretTag(line)) return false;
  StatusOr<proto::AgentSecret> got = proto::ParseSecretLine(line);
  if (!got.ok()) {
    spdlog::warn("{}: dropped {} (not shown)", tool, got.status().message());
    return true;
  }
  if (static_cast<size_t>(got->node_rank) >= nodes ||
      (from_node && got->node_rank != *from_node)) {
    spdlog::warn("{}: dropped a secret line for node {}{}", tool,
                 got->node_rank,
                 from_node ? " from node " + std::to_string(*from_node) : "");
    return true;
  }
  delegate->OnAgentSecret(got->node_rank, std::move(got->secret));
  return true;
}

}  // namespace dslaunch::launcher
