#include "launcher/local_starter.h"

#include <arpa/inet.h>  // inet_ntop
#include <fcntl.h>      // O_CLOEXEC
#include <netdb.h>      // getaddrinfo
#include <signal.h>
#include <sys/prctl.h>  // PR_SET_PDEATHSIG
#include <sys/wait.h>   // waitpid
#include <unistd.h>

#include <boost/asio/post.hpp>
#include <cerrno>
#include <cstring>
#include <set>

#include "launcher/report.h"
#include "proto/host_info.h"
#include "proto/unix_socket.h"

namespace dslaunch::launcher {

std::unique_ptr<Starter> NewLocalStarter(const StarterContext& context) {
  return std::make_unique<LocalStarter>(context.io, context.delegate);
}

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

void LocalStarter::Start(const AgentBootstrap& boot, StartDone done) {
  Status st = StartAll(boot);
  if (!st.ok()) {
    for (auto& [pid, child] : children_) Kill(child.node_rank);
  }
  boost::asio::post(io_, [st, done = std::move(done), alive = alive_] {
    if (!*alive) return;
    if (st.ok()) return done(Started{});
    done(st);
  });
}

Status LocalStarter::StartAll(const AgentBootstrap& boot) {
  for (const auto& node : boot.plan->nodes) {
    if (!IsLocalHost(node.host)) {
      return InvalidArgument("--launcher local: host " + node.host +
                             " is not this machine");
    }
  }
  for (const auto& node : boot.plan->nodes) {
    int lifeline = -1;
    const auto argv = AgentArgv(boot, node.node_rank, "127.0.0.1");
    ASSIGN_OR_RETURN(pid_t pid, Spawn(argv, boot.secret, &lifeline));
    children_[pid] = Child{node.node_rank, lifeline, false};
  }
  return Status::Ok();
}

StatusOr<pid_t> LocalStarter::Spawn(const std::vector<std::string>& args,
                                    const std::string& secret,
                                    int* lifeline_fd) {
  int in[2];
  if (::pipe2(in, O_CLOEXEC) != 0) return ErrnoStatus("pipe", errno);
  std::vector<char*> argv;
  for (const auto& a : args)
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

bool IsLocalHost(const std::string& host) {
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  if (::getaddrinfo(host.c_str(), nullptr, &hints, &res) != 0) return false;
  const auto addresses = proto::InterfaceAddresses(true);
  const std::set<std::string> local(addresses.begin(), addresses.end());
  bool is_local = false;
  for (addrinfo* r = res; r && !is_local; r = r->ai_next) {
    char buf[INET6_ADDRSTRLEN] = {0};
    if (r->ai_family == AF_INET) {
      auto* sin = reinterpret_cast<sockaddr_in*>(r->ai_addr);
      if ((ntohl(sin->sin_addr.s_addr) >> 24) == 127) is_local = true;
      ::inet_ntop(AF_INET, &sin->sin_addr, buf, sizeof(buf));
    } else if (r->ai_family == AF_INET6) {
      auto* sin6 = reinterpret_cast<sockaddr_in6*>(r->ai_addr);
      if (IN6_IS_ADDR_LOOPBACK(&sin6->sin6_addr)) is_local = true;
      ::inet_ntop(AF_INET6, &sin6->sin6_addr, buf, sizeof(buf));
    }
    if (local.count(buf)) is_local = true;
  }
  ::freeaddrinfo(res);
  return is_local;
}

}  // namespace dslaunch::launcher
