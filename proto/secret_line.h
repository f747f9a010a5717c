// The line in which an agent that makes its own node's secret hands it to
// the launcher: "DSLAUNCH-SECRET <node rank> <64 hex digits>" on the agent's
// stdout, which the start tool (pdsh, srun, mpirun) relays to the launcher
// alone; that secret is never in an environment or a command line. Pure
// functions; any thread.
#pragma once

#include <string>
#include <string_view>

#include "base/status.h"

namespace dslaunch::proto {

inline constexpr std::string_view kSecretLineTag = "DSLAUNCH-SECRET ";

// The line (without its newline) for `node_rank`'s `secret_hex`.
std::string SecretLine(int node_rank, std::string_view secret_hex);

// Whether `line` holds the tag anywhere: such a line is never shown or
// logged, parsed or not (a tool may put its own prefix before it).
bool HasSecretTag(std::string_view line);

struct AgentSecret {
  int node_rank = -1;
  std::string secret;
};
// The node rank and secret after the tag, which may follow a prefix the
// tool adds (srun --label's "0: ", mpirun --tag-output's "[1,0]<stdout>:");
// InvalidArgument (never quoting the line) when it is not one.
StatusOr<AgentSecret> ParseSecretLine(std::string_view line);

}  // namespace dslaunch::proto
