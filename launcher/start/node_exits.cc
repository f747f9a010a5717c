#include "launcher/start/node_exits.h"

#include <spdlog/spdlog.h>

#include "base/exit_status.h"

namespace dslaunch::launcher {

NodeExits::NodeExits(Starter::Delegate* delegate, std::string tool)
    : delegate_(delegate), tool_(std::move(tool)) {}

void NodeExits::Started(pid_t pid, const std::vector<int>& nodes) {
  runs_[pid] = Run{nodes, std::set<int>(nodes.begin(), nodes.end())};
  for (int node : nodes) latest_[node] = pid;
}

void NodeExits::StartedAll(pid_t pid, size_t count) {
  std::vector<int> nodes(count);
  for (size_t i = 0; i < count; ++i) nodes[i] = static_cast<int>(i);
  Started(pid, nodes);
}

void NodeExits::Ended(pid_t pid, int node, const std::string& how) {
  auto run = runs_.find(pid);
  if (run == runs_.end() || !run->second.running.erase(node)) return;
  delegate_->OnAgentProcessExited(node, how);
}

void NodeExits::ToolEnded(pid_t pid, const base::ExitInfo& info) {
  if (!info.error.empty())
    spdlog::error("cannot start {}: {}", tool_, info.error);
  const std::string how =
      "ended with " + tool_ + ", which " +
      (info.error.empty() ? DescribeWaitStatus(info.wait_status) : info.error);
  auto run = runs_.find(pid);
  if (run == runs_.end()) return;
  const std::set<int> left = std::move(run->second.running);
  runs_.erase(run);
  for (int node : left) delegate_->OnAgentProcessExited(node, how);
}

pid_t NodeExits::RunOf(int node) const {
  auto latest = latest_.find(node);
  if (latest == latest_.end()) return -1;
  auto run = runs_.find(latest->second);
  return run != runs_.end() && run->second.running.count(node) ? run->first
                                                               : -1;
}

int NodeExits::NodeOf(pid_t pid) const {
  auto it = runs_.find(pid);
  return it != runs_.end() && it->second.nodes.size() == 1 ? it->second.nodes[0]
                                                           : -1;
}

void NodeExits::AgentIn(int node, const AgentProcess& agent) {
  if (agent.pid > 1) agent_pids_[node] = agent;
}

void NodeExits::KillAgent(
    int node, base::ProcessSet& processes,
    const std::function<base::ProcessSpec(const AgentProcess&)>& spec_for) {
  auto it = agent_pids_.find(node);
  if (it == agent_pids_.end()) return;
  base::ProcessSpec spec = spec_for(it->second);
  spec.death_signal = 0;
  spec.destroy_signal = 0;
  if (StatusOr<pid_t> pid = processes.Spawn(spec); pid.ok())
    killers_[*pid] = node;
  agent_pids_.erase(it);
}

bool NodeExits::KillerLine(pid_t pid, const std::string& line) {
  auto killer = killers_.find(pid);
  if (killer == killers_.end()) return false;
  if (line.find(kAgentGone) != std::string::npos) {
    const int node = killer->second;
    Ended(RunOf(node), node, "killed by its pid");
  }
  spdlog::info("{} (kill): {}", tool_, line);
  return true;
}

}  // namespace dslaunch::launcher
