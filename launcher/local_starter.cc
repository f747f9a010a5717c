#include <fcntl.h>      // O_CLOEXEC
#include <signal.h>
#include <sys/prctl.h>  // PR_SET_PDEATHSIG
#include <sys/wait.h>   // waitpid
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "launcher/report.h"
#include "launcher/starter.h"
#include "proto/host_info.h"
#include "proto/unix_socket.h"

namespace dslaunch::launcher {

LocalStarter::LocalStarter(boost::asio::io_context& io, Delegate* delegate)
    : io_(io), delegate_(delegate), sigchld_(io, SIGCHLD) {
  WaitForSigchld();
}

LocalStarter::~LocalStarter() {
  *alive_ = false;
  for (auto& [pid, child] : children_) {
    if (child.lifeline_fd >= 0) ::close(child.lifeline_fd);
  }
}

Status LocalStarter::Start(const std::vector<AgentLaunch>& launches,
                           const std::string& secret) {
  for (const auto& launch : launches) {
    int lifeline = -1;
    ASSIGN_OR_RETURN(pid_t pid, Spawn(launch, secret, &lifeline));
    children_[pid] = Child{launch.node_rank, lifeline, false};
  }
  return Status::Ok();
}

StatusOr<pid_t> LocalStarter::Spawn(const AgentLaunch& launch,
                                    const std::string& secret,
                                    int* lifeline_fd) {
  int in[2];
  if (::pipe2(in, O_CLOEXEC) != 0) return ErrnoStatus("pipe", errno);
  std::vector<char*> argv;
  for (const auto& a : launch.argv)
    argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  const pid_t parent = ::getpid();
  const pid_t pid = ::fork();
  if (pid < 0) return ErrnoStatus("fork", errno);
  if (pid == 0) {
    ::setsid();
    ::prctl(PR_SET_PDEATHSIG, SIGTERM);
    if (::getppid() != parent) ::_exit(69);
    ::dup2(in[0], 0);
    proto::PrepareChildForExec();
    ::execv(argv[0], argv.data());
    const char msg[] = "dslaunch: cannot execute the agent\n";
    ssize_t ignored = ::write(2, msg, sizeof(msg) - 1);
    (void)ignored;
    ::_exit(127);
  }
  ::close(in[0]);
  *lifeline_fd = in[1];
  // A pipe holds 64 KiB, so this never blocks; a dead agent gives EPIPE.
  (void)proto::WriteAll(in[1], secret + "\n");
  return pid;
}

void LocalStarter::Kill(int node_rank) {
  for (auto& [pid, child] : children_) {
    if (child.node_rank == node_rank && !child.reaped) ::kill(pid, SIGKILL);
  }
}

void LocalStarter::WaitForSigchld() {
  sigchld_.async_wait(
      [this, alive = alive_](const boost::system::error_code& ec, int) {
        if (ec || !*alive) return;
        Reap();
        WaitForSigchld();
      });
}

void LocalStarter::Reap() {
  for (auto& [pid, child] : children_) {
    if (child.reaped) continue;
    int status = 0;
    if (::waitpid(pid, &status, WNOHANG) != pid) continue;
    child.reaped = true;
    ::close(child.lifeline_fd);
    child.lifeline_fd = -1;
    delegate_->OnAgentProcessExited(child.node_rank,
                                    DescribeWaitStatus(status));
  }
}

}  // namespace dslaunch::launcher
