#include "launcher/pdsh_starter.h"

#include <fcntl.h>
#include <netdb.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <boost/asio/buffer.hpp>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>

#include "launcher/report.h"
#include "proto/host_info.h"

namespace dslaunch::launcher {

namespace asio = boost::asio;

std::string PdshSshArgs(const SshTarget& t) {
  std::string a = "-o BatchMode=yes -o ConnectTimeout=" +
                  std::to_string(static_cast<int>(t.timeout_s));
  if (t.port > 0) a += " -p " + std::to_string(t.port);
  if (!t.user.empty()) a += " -l " + t.user;
  if (!t.identity.empty()) a += " -i " + t.identity;
  if (!t.known_hosts.empty()) a += " -o UserKnownHostsFile=" + t.known_hosts;
  if (!t.config_file.empty()) a += " -F " + t.config_file;
  a += t.check == HostKeyCheck::kStrict ? " -o StrictHostKeyChecking=yes"
       : t.check == HostKeyCheck::kAcceptNew
           ? " -o StrictHostKeyChecking=accept-new"
           : " -o StrictHostKeyChecking=no";
  return a;
}

static std::string Join(const std::vector<std::string>& v, const char* sep) {
  std::string out;
  for (const auto& s : v) out += (out.empty() ? "" : sep) + s;
  return out;
}

// Forks pdsh with stdout and stderr on pipes; returns its pid.
static pid_t SpawnPdsh(const PdshSettings& s,
                       const std::vector<std::string>& hosts,
                       const std::string& command, int* out_fd, int* err_fd) {
  int out[2], err[2];
  if (::pipe2(out, O_CLOEXEC) != 0 || ::pipe2(err, O_CLOEXEC) != 0) return -1;
  std::vector<std::string> argv = {s.pdsh, "-S",
                                   "-R",   "ssh",
                                   "-f",   std::to_string(s.fanout),
                                   "-w",   Join(hosts, ","),
                                   command};
  std::vector<char*> cargv;
  for (auto& a : argv) cargv.push_back(a.data());
  cargv.push_back(nullptr);
  const pid_t parent = ::getpid();
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::setsid();
    ::prctl(PR_SET_PDEATHSIG, SIGTERM);
    if (::getppid() != parent) ::_exit(127);
    int null_fd = ::open("/dev/null", O_RDONLY);
    ::dup2(null_fd, 0);
    ::dup2(out[1], 1);
    ::dup2(err[1], 2);
    proto::PrepareChildForExec();
    ::setenv("PDSH_SSH_ARGS_APPEND", s.ssh_args.c_str(), 1);
    ::execvp(cargv[0], cargv.data());
    std::fprintf(stderr, "pdsh@dslaunch: cannot execute %s: %s\n", cargv[0],
                 std::strerror(errno));
    ::_exit(127);
  }
  ::close(out[1]);
  ::close(err[1]);
  *out_fd = out[0];
  *err_fd = err[0];
  return pid;
}

PdshStarter::PdshStarter(asio::io_context& io, Delegate* delegate,
                         PdshSettings settings, std::vector<std::string> hosts)
    : io_(io),
      delegate_(delegate),
      settings_(std::move(settings)),
      hosts_(std::move(hosts)),
      sigchld_(io, SIGCHLD),
      exited_(hosts_.size(), false) {}

PdshStarter::~PdshStarter() {
  *alive_ = false;
  if (pid_ > 0) ::kill(-pid_, SIGTERM);
}

int PdshStarter::NodeOf(const std::string& host) const {
  for (size_t i = 0; i < hosts_.size(); ++i) {
    if (hosts_[i] == host) return static_cast<int>(i);
  }
  return -1;
}

// Reads both pipes to their end, together (so neither can fill up and stall
// pdsh), for at most `timeout_s`; then kills pdsh's process group.
static void ReadBoth(int out_fd, int err_fd, double timeout_s, pid_t pid,
                     std::string* out, std::string* err) {
  const auto deadline =
      std::chrono::steady_clock::now() +
      std::chrono::milliseconds(static_cast<int64_t>(timeout_s * 1000));
  pollfd fds[2] = {{out_fd, POLLIN, 0}, {err_fd, POLLIN, 0}};
  std::string* sinks[2] = {out, err};
  std::array<char, 4096> buf;
  int open = 2;
  while (open > 0) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) {
      ::kill(-pid, SIGKILL);
      break;
    }
    if (::poll(fds, 2, static_cast<int>(left.count())) < 0 && errno != EINTR)
      break;
    for (int i = 0; i < 2; ++i) {
      if (fds[i].fd < 0 || !(fds[i].revents & (POLLIN | POLLHUP | POLLERR)))
        continue;
      const ssize_t n = ::read(fds[i].fd, buf.data(), buf.size());
      if (n > 0) {
        sinks[i]->append(buf.data(), static_cast<size_t>(n));
      } else if (n == 0 || errno != EINTR) {
        fds[i].fd = -1;
        --open;
      }
    }
  }
  ::close(out_fd);
  ::close(err_fd);
}

// What one line of pdsh output says about a node that has not passed yet;
// `before` is what an earlier line said (the remote shell's own complaint).
static SshFailure PdshFailure(bool is_err, const std::string& said,
                              const std::string& agent_path,
                              const std::string& before) {
  if (!is_err) {
    return {"agent", "unexpected answer '" + said + "'",
            "install the same dsagent version at --agent_path"};
  }
  if (said.find("exited with exit code 127") != std::string::npos) {
    return {"agent", agent_path + " is missing on the node (" + before + ")",
            "install dsagent at the same path, or pass --agent_path"};
  }
  if (said.find("exited with exit code") != std::string::npos) {
    return {"connect", before.empty() ? said : before,
            "run ssh to the node by hand to see why"};
  }
  return {"connect", said, "run ssh to the node by hand to see why"};
}

std::vector<NodeCheck> PdshStarter::Preflight(const std::string& agent_path,
                                              const std::string& expected) {
  std::vector<NodeCheck> checks(hosts_.size());
  for (size_t i = 0; i < hosts_.size(); ++i) {
    checks[i].node_rank = static_cast<int>(i);
    checks[i].host = hosts_[i];
    checks[i].failure = {"agent", "no answer through pdsh",
                         "run the pdsh command by hand"};
    addrinfo* res = nullptr;
    if (int rc = ::getaddrinfo(hosts_[i].c_str(), nullptr, nullptr, &res);
        rc != 0) {
      checks[i].failure = {"resolve", gai_strerror(rc), "check the host name"};
    } else {
      ::freeaddrinfo(res);
    }
  }
  int out_fd = -1, err_fd = -1;
  const pid_t pid =
      SpawnPdsh(settings_, hosts_, ShellQuote(agent_path) + " --version",
                &out_fd, &err_fd);
  if (pid < 0) return checks;
  std::string out, err;
  ReadBoth(out_fd, err_fd, settings_.timeout_s + 5, pid, &out, &err);
  int status = 0;
  ::waitpid(pid, &status, 0);
  auto scan = [&](const std::string& text, bool is_err) {
    size_t start = 0, nl;
    while ((nl = text.find('\n', start)) != std::string::npos) {
      std::string line = text.substr(start, nl - start);
      start = nl + 1;
      if (line.rfind("pdsh@", 0) == 0) line = line.substr(line.find(": ") + 2);
      const size_t colon = line.find(": ");
      const int node =
          colon == std::string::npos ? -1 : NodeOf(line.substr(0, colon));
      if (node < 0 || checks[node].failure.stage == "resolve") continue;
      const std::string said = line.substr(colon + 2);
      if (!is_err && said == expected) {
        checks[node].ok = true;
      } else if (!checks[node].ok) {
        checks[node].failure =
            PdshFailure(is_err, said, agent_path, checks[node].failure.message);
      }
    }
  };
  scan(out, false);
  scan(err, true);
  for (auto& c : checks) {
    c.agent_version = c.ok ? expected : "";
    if (auto route = proto::RouteTo(c.host); route.ok()) {
      c.local_address = route->local;
      c.peer_address = route->peer;
    }
  }
  return checks;
}

Status PdshStarter::Start(const std::vector<AgentLaunch>& launches,
                          const std::string&) {
  std::vector<std::string> argv = launches.at(0).argv;
  for (size_t i = 0; i + 1 < argv.size(); ++i) {
    if (argv[i] == "--node_rank")
      argv.erase(argv.begin() + i, argv.begin() + i + 2);
  }
  argv.insert(argv.end(), {"--hosts", Join(hosts_, ","), "--node_host", "%h",
                           "--secret_stdout"});
  std::string command;
  for (const auto& w : argv)
    command += (command.empty() ? "" : " ") + ShellQuote(w);
  int out_fd = -1, err_fd = -1;
  pid_ = SpawnPdsh(settings_, hosts_, command, &out_fd, &err_fd);
  if (pid_ < 0) return ErrnoStatus("cannot start pdsh", errno);
  out_ = std::make_unique<asio::posix::stream_descriptor>(io_, out_fd);
  err_ = std::make_unique<asio::posix::stream_descriptor>(io_, err_fd);
  Read(false);
  Read(true);
  WaitForSigchld();
  return Status::Ok();
}

void PdshStarter::Read(bool is_stderr) {
  auto& pipe = is_stderr ? *err_ : *out_;
  auto buf = std::make_shared<std::array<char, 4096>>();
  pipe.async_read_some(asio::buffer(*buf),
                       [this, is_stderr, buf, alive = alive_](
                           const boost::system::error_code& ec, size_t n) {
                         if (!*alive || ec) return;
                         std::string& acc = is_stderr ? err_buf_ : out_buf_;
                         acc.append(buf->data(), n);
                         size_t nl;
                         while ((nl = acc.find('\n')) != std::string::npos) {
                           std::string line = acc.substr(0, nl);
                           acc.erase(0, nl + 1);
                           HandleLine(is_stderr, line);
                         }
                         Read(is_stderr);
                       });
}

void PdshStarter::HandleLine(bool is_stderr, const std::string& raw) {
  std::string line = raw;
  if (line.rfind("pdsh@", 0) == 0) line = line.substr(line.find(": ") + 2);
  const size_t colon = line.find(": ");
  const int node =
      colon == std::string::npos ? -1 : NodeOf(line.substr(0, colon));
  const std::string said =
      colon == std::string::npos ? line : line.substr(colon + 2);
  static const std::string kSecret = "DSLAUNCH-SECRET ";
  if (!is_stderr && node >= 0 && said.rfind(kSecret, 0) == 0) {
    return delegate_->OnAgentSecret(node, said.substr(kSecret.size()));
  }
  std::string text = "[" + (node >= 0 ? hosts_[node] : std::string("pdsh")) +
                     " agent] " + said + "\n";
  std::fwrite(text.data(), 1, text.size(), stderr);
  if (node >= 0 && said.find("exited with exit code") != std::string::npos &&
      !exited_[node]) {
    exited_[node] = true;
    delegate_->OnAgentProcessExited(node, said);
  }
}

void PdshStarter::WaitForSigchld() {
  sigchld_.async_wait(
      [this, alive = alive_](const boost::system::error_code& ec, int) {
        if (ec || !*alive) return;
        int status = 0;
        if (pid_ > 0 && ::waitpid(pid_, &status, WNOHANG) == pid_) {
          pid_ = -1;
          for (size_t n = 0; n < hosts_.size(); ++n) {
            if (exited_[n]) continue;
            exited_[n] = true;
            delegate_->OnAgentProcessExited(
                static_cast<int>(n),
                "ended with pdsh, which " + DescribeWaitStatus(status));
          }
          return;
        }
        WaitForSigchld();
      });
}

void PdshStarter::Kill(int) {
  if (pid_ > 0) ::kill(-pid_, SIGKILL);  // pdsh cannot reach one node alone
}

}  // namespace dslaunch::launcher
