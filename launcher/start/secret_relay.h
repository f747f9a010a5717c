// For start modes whose agents make their own node's secret (pdsh, srun,
// mpirun: Starter::AgentsMakeSecrets): picks the agents' secret lines
// (proto/secret_line.h) out of what the tool relays from the agents' stdout
// and hands each to the Starter's delegate. A line holding the tag is never
// shown or logged, whether it parses or not. io_context thread only.
#pragma once

#include <optional>
#include <string>
#include <string_view>

#include "launcher/start/starter.h"

namespace dslaunch::launcher {

// False when `line` holds no secret tag (the caller shows it as usual);
// else true, and the secret went to `delegate` when the line names a node
// below `nodes` (and equal to `from_node`, where the tool itself says which
// node the line came from, as pdsh does: -1 for a line of no node), or was
// dropped with a warning naming `tool`.
bool RelaySecretLine(Starter::Delegate* delegate, const std::string& tool,
                     std::string_view line, size_t nodes,
                     std::optional<int> from_node = std::nullopt);

}  // namespace dslaunch::launcher
