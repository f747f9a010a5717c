// The files a worker pod's probes read (deploy/k8s, deploy/openshift):
//   --ready_file: made once the agent joined the job, removed at its end
//     (readinessProbe: test -f);
//   --alive_file: touched every second while the agent's loop runs, removed
//     at its end (livenessProbe: dsagent --alive_check FILE), so that a
//     frozen or hung agent is restarted by the kubelet and joins the job's
//     next generation.
// The pod's /tmp (an emptyDir) outlives a container: an agent that was
// killed leaves its files behind for the next one, which takes them over.
// Any other file of that name is refused, never overwritten or followed.
#pragma once

#include <string>

#include "base/status.h"

namespace dslaunch::agent {

// What the agent writes in each.
inline constexpr char kAliveText[] = "dsagent alive\n";

// What --ready_file holds: "joined\n" while a joining agent waits for its
// node (node_rank < 0), "node N\n" once it has one; and whether `text` is
// one of those.
std::string ReadyFileText(int node_rank);
bool IsReadyFileText(const std::string& text);

// Whether `path` is a file an earlier agent of this user left: a regular
// file (not a link), ours, small, holding what an agent writes ("joined",
// "node N", kAliveText).
bool LeftByAnAgent(const std::string& path);

// Checks a probe file's name before the agent starts: OK when it does not
// exist; a file LeftByAnAgent is removed (`*removed` set); else
// InvalidArgument naming `flag`.
Status ClaimProbeFile(const std::string& flag, const std::string& path,
                      bool* removed);

// dsagent --alive_check FILE: 0 when FILE was touched within `within_s`
// seconds; else 1, with why on stderr.
int CheckAlive(const std::string& path, double within_s);

}  // namespace dslaunch::agent
