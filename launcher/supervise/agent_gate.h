// AgentGate: which secret each node's agent must prove, and when a node that
// is in may get its JobSpec. Where the starter's agents prove the job's
// secret (local, ssh, join) a node gets its job as soon as its agent is in
// and node 0's free port is known. Where each agent makes its node's secret
// and the start tool relays it (pdsh, srun, mpirun):
//   - the secret is good for one connection (spent when its agent is in);
//   - a second secret line for a node means two claimed it: neither holds;
//   - a line after the node's agent is in was not written by the agent (a
//     rank can open the tool's output through /proc): ignored;
//   - no node gets its job before every node's agent is in, so that every
//     secret is spent before any rank runs: until then a secret may still
//     be in the tool's pipe or buffers, where a rank of the same user could
//     read it through /proc and race its agent.
// Owned by the Job; io_context thread only.
#pragma once

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "launcher/state/job_state.h"

namespace dslaunch::launcher {

class AgentGate {
 public:
  AgentGate(std::string job_secret, bool master_port_known);

  // The starter is known (Job::Start): whether its agents make secrets.
  void Started(bool agents_make_secrets);
  const std::string& job_secret() const { return job_secret_; }

  // The secret node_rank's agent must prove; nullopt while none is known
  // (nothing started, or its line has not come); empty once spent.
  std::optional<std::string> NodeSecret(int node_rank) const;

  enum class Line { kKept, kIgnored, kTwice };
  // A secret line the start tool relayed for node_rank, whose agent is
  // `in` (authenticated) or not: kept, ignored (after the agent was in), or
  // the node's second (both refused: the node must be failed).
  Line OnSecretLine(int node_rank, std::string secret, bool in);
  // node_rank's agent is in, or ended: its secret is spent.
  void Spend(int node_rank);
  // node_rank's agent is started again (its last one ended): it makes a new
  // secret, kept from its first line on as at the start.
  void StartingAgain(int node_rank) { node_secrets_.erase(node_rank); }

  bool master_port_known() const { return master_port_known_; }
  void SetMasterPortKnown() { master_port_known_ = true; }
  // node_rank is in: the nodes that may get their JobSpec now (it and the
  // ones held before), or none while the port or another agent is missing.
  std::vector<int> Admit(int node_rank, const JobState& state);
  // The nodes held that may get their JobSpec now (a spare that never came
  // was given up on), or none.
  std::vector<int> Release(const JobState& state);

 private:
  bool EveryAgentIn(const JobState& state) const;

  const std::string job_secret_;
  bool started_ = false;
  bool agents_make_secrets_ = false;
  bool master_port_known_;
  std::map<int, std::string> node_secrets_;  // emptied once spent
  std::vector<int> held_;
};

}  // namespace dslaunch::launcher
