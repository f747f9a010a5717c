// The agent's run directory (TMPDIR or /tmp: dsl-<job id's first 8>-XXXXXX,
// holding the store's and the progress sockets) and the ones agents killed
// before their end left behind. Each run directory names its agent in a file
// `agent` ("<pid> <start ticks>\n"); a new agent of the job removes those
// whose agent no longer runs (that pid started at that time), so a node or a
// pod whose agent was SIGKILLed and started again does not collect them.
// Stateless functions; any thread.
#pragma once

#include <string>

#include "base/status.h"

namespace dslaunch::agent {

// Makes a new run directory below `parent` for `job_id`, named after this
// process. Returns its path.
StatusOr<std::string> MakeRunDir(const std::string& parent,
                                 const std::string& job_id);

// Removes the run directories below `parent` of `job_id` whose agent is
// gone: only directories (never a link) of this user, named as MakeRunDir
// names them, whose `agent` file names a process that no longer runs.
// Returns how many were removed.
int RemoveDeadAgentsRunDirs(const std::string& parent,
                            const std::string& job_id);

}  // namespace dslaunch::agent
