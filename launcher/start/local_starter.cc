#include "launcher/start/local_starter.h"

#include <signal.h>  // SIGKILL, SIGTERM
#include <spdlog/spdlog.h>
#include <sys/prctl.h>  // PR_SET_CHILD_SUBREAPER
#include <sys/wait.h>   // WIFSIGNALED
#include <unistd.h>     // getpid, usleep

#include <boost/asio/post.hpp>
#include <cerrno>
#include <filesystem>
#include <set>
#include <vector>

#include "base/child_reaper.h"
#include "base/exit_status.h"
#include "base/host_info.h"
#include "base/process_tree.h"
#include "base/unix_socket.h"
#include "launcher/plan/addresses.h"

namespace dslaunch::launcher {

LocalStarter::LocalStarter(boost::asio::io_context& io,
                           Starter::Delegate* delegate)
    : io_(io), delegate_(delegate), processes_(io, this) {
  // What a SIGKILLed agent leaves (setsid grandchildren of its ranks,
  // daemons) comes to us instead of init, so we can end it (SweepOrphans).
  ::prctl(PR_SET_CHILD_SUBREAPER, 1);
  base::ChildReaper::Of(io).ReapOrphans([](pid_t, int) {});
}

std::unique_ptr<Starter> NewLocalStarter(const StarterContext& context) {
  return std::make_unique<LocalStarter>(context.io, context.delegate);
}

void LocalStarter::Start(const AgentBootstrap& boot, StartDone done) {
  Status st = StartAll(boot);
  if (!st.ok()) {
    for (const auto& [pid, node] : node_of_) processes_.Signal(pid, SIGKILL);
  }
  PostStartDone(io_, alive_, st, Started{}, std::move(done));
}

Status LocalStarter::StartAll(const AgentBootstrap& boot) {
  for (const auto& node : boot.plan->nodes) {
    if (!IsLocalHost(node.host)) {
      return InvalidArgument("--launcher local: host " + node.host +
                             " is not this machine");
    }
  }
  boot_ = boot;
  for (const auto& node : boot.plan->nodes) RETURN_IF_ERROR(StartAgent(node));
  return Status::Ok();
}

void LocalStarter::StartAgain(int node_rank) {
  Status st = boot_.plan && node_rank >= 0 &&
                      static_cast<size_t>(node_rank) < boot_.plan->nodes.size()
                  ? StartAgent(boot_.plan->nodes[node_rank])
                  : InvalidArgument("no node " + std::to_string(node_rank));
  if (st.ok()) return;
  boost::asio::post(io_, [this, node_rank, st, alive = alive_] {
    if (*alive)
      delegate_->OnAgentProcessExited(
          node_rank, "could not be started again: " + st.message());
  });
}

Status LocalStarter::StartAgent(const NodePlan& node) {
  const AgentBootstrap& boot = boot_;
  base::ProcessSpec spec;
  spec.argv = AgentArgv(boot, node.node_rank, "127.0.0.1");
  spec.inherit_env = true;
  spec.new_session = true;
  spec.death_signal = SIGTERM;
  spec.stdin_pipe = true;
  // The agent's own log lines reach the console (never the terminal
  // directly, where they would cut into the live table).
  spec.capture_output = true;
  spec.destroy_signal = 0;  // the closed lifeline tells it to go
  ASSIGN_OR_RETURN(pid_t pid, processes_.Spawn(spec));
  node_of_[pid] = node.node_rank;
  host_of_[pid] = node.host;
  cgroup_of_[pid] = base::JobCgroupDir(boot.job_id, node.node_rank, pid);
  // A pipe holds 64 KiB, so this never blocks; a dead agent gives EPIPE.
  (void)base::WriteAll(processes_.StdinOf(pid), boot.secret + "\n");
  return Status::Ok();
}

void LocalStarter::OnProcessOutput(pid_t pid, bool, std::string line, bool) {
  auto it = host_of_.find(pid);
  delegate_->OnStarterOutput(it == host_of_.end() ? "local" : it->second,
                             std::move(line));
}

void LocalStarter::Kill(int node_rank) {
  for (const auto& [pid, node] : node_of_) {
    if (node == node_rank) processes_.Signal(pid, SIGKILL);
  }
}

void LocalStarter::OnProcessExited(pid_t pid, const base::ExitInfo& info) {
  const int node = node_of_[pid];
  node_of_.erase(pid);
  const std::string cgroup = cgroup_of_[pid];
  cgroup_of_.erase(pid);
  if (!info.error.empty()) {
    spdlog::error("node {}: cannot start the agent: {}", node, info.error);
  }
  // An agent that ended on its own killed its job's tree itself; one killed
  // by a signal (SIGKILL) left it to us.
  if (WIFSIGNALED(info.wait_status)) {
    SweepOrphans();
    RemoveCgroup(cgroup);
  }
  delegate_->OnAgentProcessExited(node, DescribeWaitStatus(info.wait_status));
}

// A SIGKILLed agent leaves its (emptied) cgroup behind when the sweep took
// its guard too; an agent that ended normally removed it itself.
void LocalStarter::RemoveCgroup(const std::string& dir) {
  if (dir.empty()) return;
  // A restarted job's agent makes one per generation: <dir>-g<N>.
  std::vector<std::string> dirs = {dir};
  const std::filesystem::path base(dir);
  std::error_code ec;
  for (const auto& entry :
       std::filesystem::directory_iterator(base.parent_path(), ec)) {
    const std::string name = entry.path().filename().string();
    if (name.rfind(base.filename().string() + "-g", 0) == 0)
      dirs.push_back(entry.path().string());
  }
  for (const std::string& d : dirs) {
    for (int i = 0; i < 100 && ::rmdir(d.c_str()) != 0 && errno == EBUSY; ++i) {
      ::usleep(5000);  // its last processes are still exiting
    }
  }
}

// Everything below us but the live agents (and their own trees) was left by
// an agent that is gone: kill it, by pid, until none is left (bounded).
void LocalStarter::SweepOrphans() {
  std::set<pid_t> agents;
  for (const auto& [pid, node] : node_of_) agents.insert(pid);
  for (int round = 0; round < 100; ++round) {
    if (base::SignalLiveDescendants(::getpid(), agents, SIGKILL) == 0) return;
    if (round > 0) ::usleep(5000);  // let the kernel finish the kills
  }
  spdlog::warn("processes left by a lost agent are still alive after SIGKILL");
}

}  // namespace dslaunch::launcher
