// Starting the agents: the local starter for hosts that are this machine,
// the ssh starter (with its preflight) otherwise.
#include <limits.h>  // PATH_MAX
#include <spdlog/spdlog.h>
#include <unistd.h>  // readlink

#include <boost/asio/post.hpp>

#include "launcher/launcher.h"
#include "launcher/pdsh_starter.h"
#include "proto/host_info.h"

namespace dslaunch::launcher {

std::string DefaultAgentPath() {
  char buf[PATH_MAX] = {0};
  ssize_t n = ::readlink("/proc/self/exe", buf, sizeof(buf) - 1);
  if (n <= 0) return "dsagent";
  std::string self(buf, static_cast<size_t>(n));
  return self.substr(0, self.rfind('/') + 1) + "dsagent";
}

std::vector<SshTarget> SshTargets(const LaunchOptions& o, const Plan& plan) {
  std::vector<SshTarget> targets;
  for (const auto& node : plan.nodes) {
    SshTarget t;
    t.host = node.host;
    t.port = node.ssh_port.value_or(o.ssh_port);
    t.user = node.ssh_user.value_or(o.ssh_user);
    t.identity = o.ssh_identity;
    t.config_file = o.ssh_config;
    t.known_hosts = o.ssh_known_hosts;
    t.check = o.ssh_host_key_check == "off"          ? HostKeyCheck::kOff
              : o.ssh_host_key_check == "accept-new" ? HostKeyCheck::kAcceptNew
                                                     : HostKeyCheck::kStrict;
    t.timeout_s = o.ssh_timeout_s;
    targets.push_back(std::move(t));
  }
  return targets;
}

std::string DescribeCheckFailure(const NodeCheck& c) {
  return "node " + std::to_string(c.node_rank) + " (" + c.host +
         "): " + c.failure.stage + " failed: " + c.failure.message + " -- " +
         c.failure.hint;
}

bool Launcher::UseSsh() const {
  if (options_.launcher == "ssh") return true;
  if (options_.launcher == "local") return false;
  for (const auto& node : plan_.nodes) {
    if (!IsLocalHost(node.host)) return true;
  }
  return false;
}

std::vector<std::string> Launcher::AgentArgv(int node_rank,
                                             std::string connect_host,
                                             int port) const {
  const std::string agent =
      options_.agent_path.empty() ? DefaultAgentPath() : options_.agent_path;
  if (!options_.control_addr.empty()) connect_host = options_.control_addr;
  return {agent,
          "--connect",
          proto::JoinHostPort(connect_host, port),
          "--node_rank",
          std::to_string(node_rank),
          "--job_id",
          job_id_,
          "--log_level",
          options_.log_level,
          "--connect_timeout",
          std::to_string(options_.start_timeout_s)};
}

std::vector<AgentLaunch> Launcher::MakeLaunches(
    int port, const std::vector<std::string>& connect_hosts) {
  std::vector<AgentLaunch> launches;
  for (const auto& node : plan_.nodes) {
    launches.push_back(AgentLaunch{
        node.node_rank, node.host,
        AgentArgv(node.node_rank, connect_hosts[node.node_rank], port)});
  }
  return launches;
}

Status Launcher::StartPdsh(int port) {
  std::vector<std::string> hosts;
  for (const auto& node : plan_.nodes) {
    if (node.ssh_port || node.ssh_user) {
      return InvalidArgument("--launcher pdsh: per-host port= or user= (host " +
                             node.host +
                             ") cannot be passed through pdsh; use "
                             "--ssh_port/--ssh_user or --launcher ssh");
    }
    hosts.push_back(node.host);
  }
  PdshSettings settings;
  settings.fanout = options_.ssh_fanout;
  settings.timeout_s = options_.ssh_timeout_s;
  settings.ssh_args = PdshSshArgs(SshTargets(options_, plan_).at(0));
  auto pdsh = std::make_unique<PdshStarter>(io_, this, settings, hosts);
  const std::string agent =
      options_.agent_path.empty() ? DefaultAgentPath() : options_.agent_path;
  std::vector<NodeCheck> checks =
      pdsh->Preflight(agent, ExpectedAgentVersion());
  starter_ = std::move(pdsh);
  // Runs on the loop, like the ssh preflight's answer.
  boost::asio::post(io_,
                    [this, port, checks] { OnPreflightDone(port, checks); });
  return Status::Ok();
}

Status Launcher::StartAgents(int port) {
  if (options_.launcher == "pdsh") return StartPdsh(port);
  if (!UseSsh()) {
    for (const auto& node : plan_.nodes) {
      if (!IsLocalHost(node.host)) {
        return InvalidArgument("--launcher local: host " + node.host +
                               " is not this machine");
      }
    }
    starter_ = std::make_unique<LocalStarter>(io_, this);
    std::vector<std::string> loopback(plan_.nodes.size(), "127.0.0.1");
    return starter_->Start(MakeLaunches(port, loopback), secret_);
  }
  auto ssh = std::make_unique<SshStarter>(io_, this, options_.ssh_fanout);
  SshStarter* raw = ssh.get();
  starter_ = std::move(ssh);
  // One command per node: the agent announces its version (the preflight's
  // check) and then waits for the secret, which comes only once every node
  // has passed. A node that fails leaves nothing: its agent ends when the
  // connection closes.
  auto command_for = [this, port](int node, const std::string& local_addr) {
    std::vector<std::string> argv = AgentArgv(node, local_addr, port);
    argv.push_back("--announce");
    std::string command;
    for (const auto& w : argv)
      command += (command.empty() ? "" : " ") + ShellQuote(w);
    return command;
  };
  raw->Preflight(SshTargets(options_, plan_), command_for,
                 ExpectedAgentVersion(),
                 [this, port](std::vector<NodeCheck> checks) {
                   OnPreflightDone(port, checks);
                 });
  return Status::Ok();
}

void Launcher::OnPreflightDone(int port, const std::vector<NodeCheck>& checks) {
  if (state_ != State::kStarting) return;  // interrupted meanwhile
  std::vector<std::string> connect_hosts;
  for (const auto& c : checks) {
    if (!c.ok) {
      console_.Note(DescribeCheckFailure(c));
      preflight_failed_ = true;
    }
    connect_hosts.push_back(c.local_address);
  }
  if (preflight_failed_) {
    SetState(State::kDone);
    io_.stop();
    return;
  }
  if (options_.plan.master_addr.empty())
    plan_.master_addr = checks[0].peer_address;
  spdlog::info("preflight passed on {} nodes; starting agents", checks.size());
  Status st = starter_->Start(MakeLaunches(port, connect_hosts), secret_);
  if (!st.ok()) {
    console_.Note(st.message());
    preflight_failed_ = true;
    SetState(State::kDone);
    io_.stop();
  }
}

}  // namespace dslaunch::launcher
