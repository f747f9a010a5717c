#include "launcher/doctor.h"

#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <cstdio>

#include "base/exit_status.h"
#include "launcher/start/ssh_starter.h"

namespace dslaunch::launcher {

namespace {

const char* const kStages[] = {"resolve", "connect", "host key", "auth",
                               "agent"};

class NoDelegate : public Starter::Delegate {
  void OnAgentProcessExited(int, const std::string&) override {}
  void OnStarterOutput(const std::string&, std::string) override {}
};

// "ok" before the failed stage, "FAIL" at it, "-" after it.
std::string Cell(const NodeCheck& c, int stage) {
  if (c.ok) return "ok";
  int failed = 0;
  while (failed < 5 && c.failure.stage != kStages[failed]) ++failed;
  return stage < failed ? "ok" : stage == failed ? "FAIL" : "-";
}

std::string Row(const std::vector<std::string>& cells) {
  static const int kWidths[] = {5, 18, 16, 8, 8, 9, 5, 6, 7};
  std::string out;
  for (size_t i = 0; i < cells.size(); ++i) {
    char buf[128];
    std::snprintf(buf, sizeof(buf), "%-*s", kWidths[i] + 1, cells[i].c_str());
    out += buf;
  }
  while (!out.empty() && out.back() == ' ') out.pop_back();
  return out + "\n";
}

}  // namespace

int RunDoctor(const LaunchOptions& options, const Plan& plan) {
  boost::asio::io_context io;
  NoDelegate delegate;
  SshStarter ssh(io, &delegate, options.ssh_fanout);
  std::vector<NodeCheck> checks;
  // The checks run on the pool; keep the loop alive until they report.
  auto work = boost::asio::make_work_guard(io);
  const std::string agent = AgentPath(options);
  auto command_for = [agent](int, const std::string&) {
    // An older agent does not know --host_check: then the plain version
    // line, so that a mismatch is named as one.
    return ShellQuote(agent) + " --version --host_check 2>/dev/null || " +
           ShellQuote(agent) + " --version";
  };
  ssh.Preflight(
      SshTargets(options, plan), command_for, ExpectedAgentVersion(),
      [&](std::vector<NodeCheck> result) {
        checks = std::move(result);
        work.reset();
      },
      /*read_all=*/true);
  io.run();
  std::string out = Row({"node", "host", "address", "resolve", "connect",
                         "host key", "auth", "agent", "time"});
  int failed = 0;
  for (const auto& c : checks) {
    char secs[32];
    std::snprintf(secs, sizeof(secs), "%.2fs", c.seconds);
    out += Row({std::to_string(c.node_rank), c.host,
                c.peer_address.empty() ? "-" : c.peer_address, Cell(c, 0),
                Cell(c, 1), Cell(c, 2), Cell(c, 3), Cell(c, 4), secs});
    if (!c.ok) ++failed;
  }
  for (const auto& c : checks) {
    if (!c.ok) out += DescribeCheckFailure(c) + "\n";
    for (const auto& note : c.notes) {
      out += "warning: node " + std::to_string(c.node_rank) + " (" + c.host +
             "): " + note + "\n";
    }
  }
  out += std::to_string(checks.size() - failed) + " of " +
         std::to_string(checks.size()) + " nodes ready\n";
  std::fputs(out.c_str(), stdout);
  return failed ? kExitUnavailable : kExitOk;
}

}  // namespace dslaunch::launcher
