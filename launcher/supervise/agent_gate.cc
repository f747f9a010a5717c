#include "launcher/supervise/agent_gate.h"

namespace dslaunch::launcher {

AgentGate::AgentGate(std::string job_secret, bool master_port_known)
    : job_secret_(std::move(job_secret)),
      master_port_known_(master_port_known) {}

void AgentGate::Started(bool agents_make_secrets) {
  started_ = true;
  agents_make_secrets_ = agents_make_secrets;
}

std::optional<std::string> AgentGate::NodeSecret(int node_rank) const {
  if (!started_) return std::nullopt;
  if (!agents_make_secrets_) return job_secret_;
  auto it = node_secrets_.find(node_rank);
  if (it == node_secrets_.end()) return std::nullopt;
  return it->second;
}

AgentGate::Line AgentGate::OnSecretLine(int node_rank, std::string secret,
                                        bool in) {
  if (in) return Line::kIgnored;
  auto [it, inserted] = node_secrets_.try_emplace(node_rank, std::move(secret));
  if (inserted) return Line::kKept;
  it->second.clear();  // a second claim: neither proves anything
  return Line::kTwice;
}

void AgentGate::Spend(int node_rank) {
  if (auto it = node_secrets_.find(node_rank); it != node_secrets_.end())
    it->second.clear();
}

bool AgentGate::EveryAgentIn(const JobState& state) const {
  if (!agents_make_secrets_) return true;
  // Spares too (their secrets are in the same pipe), unless one was given
  // up on (lost before it came in: its secret never will).
  for (const NodeRecord& node : state.nodes()) {
    if (!node.authenticated && (node.member || node.lost_reason.empty()))
      return false;
  }
  return true;
}

std::vector<int> AgentGate::Admit(int node_rank, const JobState& state) {
  held_.push_back(node_rank);
  return Release(state);
}

std::vector<int> AgentGate::Release(const JobState& state) {
  if (!master_port_known_ || !EveryAgentIn(state)) return {};
  std::vector<int> admitted;
  admitted.swap(held_);
  return admitted;
}

}  // namespace dslaunch::launcher
