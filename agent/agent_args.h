// What dsagent's main() makes of its command line and stdin before the Agent
// starts: the launcher's address, the node's index in a --hosts list (pdsh
// runs one command on every node) and the secret line.
#pragma once

#include <optional>
#include <string>

#include "base/status.h"

namespace dslaunch::agent {

// "HOST:PORT" or "[IPV6]:PORT" into host (brackets removed) and port
// (1-65535). InvalidArgument naming the value otherwise.
Status ParseConnect(const std::string& connect, std::string* host, int* port);

// The index of `me` in the comma-separated `hosts`; InvalidArgument when it
// is not there.
StatusOr<int> NodeRankInHosts(const std::string& hosts, const std::string& me);

// The node rank a joining agent (--join) claims: `flag` (--node_rank, when
// given), else JOB_COMPLETION_INDEX (a Kubernetes Indexed Job), else the
// hostname's trailing "-N" (a StatefulSet's pod "train-worker-3"), else -1
// (the launcher gives the first free). `said` gets where it came from. A
// JOB_COMPLETION_INDEX that is not a number 0..65535 is InvalidArgument.
StatusOr<int> JoinNodeRank(std::optional<int> flag,
                           const char* job_completion_index,
                           const std::string& hostname, std::string* said);

// The value of the variable `name` (a key handed over in the environment),
// then wiped: every copy in `environ` overwritten in place (/proc/PID/environ
// shows the original block, and getenv finds only the first of repeated
// entries) and the variable unset. InvalidArgument when unset or empty.
StatusOr<std::string> TakeVariable(const std::string& name);

// One line (without its newline) from `fd`, at most 4096 bytes; false on a
// longer line or on end of file before any byte. Reads byte by byte, so the
// rest of the stream (the launcher's lifeline) stays unread.
bool ReadSecretLine(int fd, std::string* out);

}  // namespace dslaunch::agent
