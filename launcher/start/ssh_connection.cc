#include "launcher/start/ssh_connection.h"

#include <netdb.h>       // getaddrinfo
#include <sys/socket.h>  // getsockname

#include <chrono>
#include <cmath>  // floor
#include <cstdio>
#include <cstdlib>

#include "base/host_info.h"
#include "base/unix_time.h"

namespace dslaunch::launcher {

const char* StageOf(SshStep step) {
  switch (step) {
    case SshStep::kResolve:
      return "resolve";
    case SshStep::kTcpConnect:
    case SshStep::kHandshake:
      return "connect";
    case SshStep::kHostKey:
      return "host key";
    case SshStep::kAuth:
      return "auth";
    case SshStep::kOpenChannel:
    case SshStep::kRunAgent:
      return "agent";
  }
  return "agent";
}

namespace {

// Per step: what timed out (followed by the host), what had worked before
// it, and what can cause it.
struct StepText {
  const char* what;
  const char* worked;
  const char* hint;
};

StepText TextOf(SshStep step) {
  switch (step) {
    case SshStep::kResolve:
      return {"resolving", "",
              "the DNS server is slow or unreachable: check /etc/resolv.conf, "
              "or list the node in /etc/hosts"};
    case SshStep::kTcpConnect:
      return {"TCP connect to", "no answer at all",
              "the node is down or unreachable, or a firewall drops the "
              "packets: check the address and the port (--ssh_port, port=)"};
    case SshStep::kHandshake:
      return {"SSH handshake with", "the TCP connection was accepted",
              "what listens on that port may not be sshd, or sshd is "
              "overloaded (MaxStartups): check the port and the node's sshd"};
    case SshStep::kHostKey:
      return {"checking the host key of", "",
              "check that the known_hosts file is on a responsive file system"};
    case SshStep::kAuth:
      return {"authentication on", "the SSH handshake succeeded",
              "ssh-agent may wait for a confirmation or PIN, or the node's "
              "PAM/LDAP or reverse DNS (UseDNS) is slow: try ssh -v to it"};
    case SshStep::kOpenChannel:
      return {"opening a session to run the agent on", "login succeeded",
              "the node is overloaded or its sshd limits sessions "
              "(MaxSessions): check its sshd log"};
    case SshStep::kRunAgent:
      return {"waiting for the agent's version line from",
              "the command started",
              "the node is overloaded, or its shell startup files wait for "
              "input or a slow file system: try the command with ssh by hand, "
              "or raise --ssh_timeout"};
  }
  return {"", "", ""};
}

}  // namespace

SshFailure TimeoutFailure(SshStep step, const std::string& host,
                          double timeout_s) {
  char seconds[32];
  std::snprintf(seconds, sizeof(seconds), "%g", timeout_s);
  const StepText text = TextOf(step);
  std::string message = std::string(text.what) + " " + host +
                        " timed out after " + seconds + " s";
  if (*text.worked) message += std::string(" (") + text.worked + ")";
  return {StageOf(step), message, text.hint};
}

std::string ShellQuote(const std::string& word) {
  std::string out = "'";
  for (char c : word) {
    if (c == '\'')
      out += "'\\''";
    else
      out.push_back(c);
  }
  return out + "'";
}

SshConnection::~SshConnection() { Close(); }

void SshConnection::Close() {
  if (channel_) {
    ssh_channel_close(channel_);
    ssh_channel_free(channel_);
    channel_ = nullptr;
  }
  if (session_) {
    ssh_disconnect(session_);
    ssh_free(session_);
    session_ = nullptr;
  }
}

static std::string HomePath(const std::string& rel) {
  const char* home = std::getenv("HOME");
  return std::string(home ? home : "") + "/" + rel;
}

void SshConnection::ReadAddresses() {
  const int fd = ssh_get_fd(session_);
  sockaddr_storage a{};
  socklen_t len = sizeof(a);
  if (::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0) {
    local_address_ = base::AddressToString(reinterpret_cast<sockaddr*>(&a));
  }
  len = sizeof(a);
  if (::getpeername(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0) {
    peer_address_ = base::AddressToString(reinterpret_cast<sockaddr*>(&a));
  }
}

bool SshConnection::Resolve(const SshTarget& target, SshFailure* failure) {
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  const int rc = ::getaddrinfo(target.host.c_str(), nullptr, &hints, &res);
  if (rc == 0) {
    ::freeaddrinfo(res);
    return true;
  }
  if (rc == EAI_AGAIN) {
    // The resolver's own timeout (resolv.conf), not --ssh_timeout.
    *failure = TimeoutFailure(SshStep::kResolve, target.host, target.timeout_s);
    failure->message = "resolving " + target.host +
                       " timed out: " + gai_strerror(rc) +
                       " (no answer from the name server)";
    return false;
  }
  *failure = {"resolve", gai_strerror(rc),
              "check the host name in the hostfile and DNS or /etc/hosts"};
  return false;
}

// After ssh_connect timed out: a banner or a connected socket means TCP got
// through and the SSH handshake stalled.
static SshStep ConnectStepThatTimedOut(ssh_session session) {
  if (ssh_get_serverbanner(session) != nullptr) return SshStep::kHandshake;
  const int fd = ssh_get_fd(session);
  sockaddr_storage peer{};
  socklen_t len = sizeof(peer);
  if (fd >= 0 &&
      ::getpeername(fd, reinterpret_cast<sockaddr*>(&peer), &len) == 0) {
    return SshStep::kHandshake;
  }
  return SshStep::kTcpConnect;
}

bool SshConnection::Connect(const SshTarget& target, SshFailure* failure) {
  // Whole seconds and the fraction: SSH_OPTIONS_TIMEOUT alone cuts 0.5 s to
  // 0, which libssh reads as its 10 s default.
  const long timeout = static_cast<long>(std::floor(target.timeout_s));
  const long timeout_usec = static_cast<long>(
      (target.timeout_s - static_cast<double>(timeout)) * 1e6);
  ssh_options_set(session_, SSH_OPTIONS_TIMEOUT, &timeout);
  ssh_options_set(session_, SSH_OPTIONS_TIMEOUT_USEC, &timeout_usec);
  if (ssh_connect(session_) == SSH_OK) return true;
  const std::string error = ssh_get_error(session_);
  if (error.find("Timeout") != std::string::npos) {
    *failure = TimeoutFailure(ConnectStepThatTimedOut(session_), target.host,
                              target.timeout_s);
    return false;
  }
  *failure = {"connect", error,
              "check that sshd runs on the node and the port is right"};
  return false;
}

bool SshConnection::Open(const SshTarget& target, SshFailure* failure) {
  host_ = target.host;
  if (!Resolve(target, failure)) return false;
  session_ = ssh_new();
  ssh_options_set(session_, SSH_OPTIONS_HOST, target.host.c_str());
  const std::string config =
      target.config_file.empty() ? HomePath(".ssh/config") : target.config_file;
  ssh_options_parse_config(session_, config.c_str());
  // Explicit settings (hostfile, flags) override the config file.
  if (target.port > 0) {
    const unsigned port = static_cast<unsigned>(target.port);
    ssh_options_set(session_, SSH_OPTIONS_PORT, &port);
  }
  if (!target.user.empty())
    ssh_options_set(session_, SSH_OPTIONS_USER, target.user.c_str());
  const std::string known = target.known_hosts.empty()
                                ? HomePath(".ssh/known_hosts")
                                : target.known_hosts;
  ssh_options_set(session_, SSH_OPTIONS_KNOWNHOSTS, known.c_str());
  if (!Connect(target, failure)) return false;
  ReadAddresses();
  return CheckHostKey(target, failure) && Authenticate(target, failure);
}

bool SshConnection::CheckHostKey(const SshTarget& target, SshFailure* failure) {
  if (target.check == HostKeyCheck::kOff) return true;
  const std::string known = target.known_hosts.empty()
                                ? HomePath(".ssh/known_hosts")
                                : target.known_hosts;
  switch (ssh_session_is_known_server(session_)) {
    case SSH_KNOWN_HOSTS_OK:
      return true;
    case SSH_KNOWN_HOSTS_CHANGED:
    case SSH_KNOWN_HOSTS_OTHER:
      *failure = {
          "host key",
          "host key of " + target.host + " does not match the one in " + known,
          "if the node was reinstalled, remove its line from " + known +
              " (ssh-keygen -R); otherwise suspect an attack"};
      return false;
    case SSH_KNOWN_HOSTS_NOT_FOUND:
    case SSH_KNOWN_HOSTS_UNKNOWN:
      if (target.check == HostKeyCheck::kAcceptNew &&
          ssh_session_update_known_hosts(session_) == SSH_OK) {
        return true;
      }
      *failure = {
          "host key", target.host + " is not in " + known,
          "add its key (ssh-keyscan) or pass --ssh_host_key_check accept-new"};
      return false;
    default:
      *failure = {"host key", ssh_get_error(session_), "check " + known};
      return false;
  }
}

bool SshConnection::Authenticate(const SshTarget& target, SshFailure* failure) {
  int rc = SSH_AUTH_DENIED;
  if (!target.identity.empty()) {
    ssh_key key = nullptr;
    if (ssh_pki_import_privkey_file(target.identity.c_str(), nullptr, nullptr,
                                    nullptr, &key) != SSH_OK) {
      *failure = {"auth", "cannot read identity file " + target.identity,
                  "check --ssh_identity (an unencrypted private key)"};
      return false;
    }
    rc = ssh_userauth_publickey(session_, nullptr, key);
    ssh_key_free(key);
  } else {
    rc = ssh_userauth_publickey_auto(session_, nullptr, nullptr);
  }
  if (rc == SSH_AUTH_SUCCESS) return true;
  if (rc == SSH_AUTH_AGAIN) {  // blocking mode: the reply did not come in time
    *failure = TimeoutFailure(SshStep::kAuth, target.host, target.timeout_s);
    return false;
  }
  *failure = {"auth",
              std::string("public key authentication refused: ") +
                  ssh_get_error(session_),
              "install your public key in the node's authorized_keys, or pass "
              "--ssh_identity / --ssh_user"};
  return false;
}

bool SshConnection::OpenChannel(const std::string& command, double timeout_s,
                                SshFailure* failure) {
  channel_ = ssh_channel_new(session_);
  int rc = channel_ ? ssh_channel_open_session(channel_) : SSH_ERROR;
  if (rc == SSH_OK) rc = ssh_channel_request_exec(channel_, command.c_str());
  if (rc == SSH_OK) return true;
  if (rc == SSH_AGAIN) {
    *failure = TimeoutFailure(SshStep::kOpenChannel, host_, timeout_s);
  } else {
    *failure = {"agent",
                std::string("the node refused a session to run the agent: ") +
                    ssh_get_error(session_),
                "check the node's sshd log (MaxSessions, ForceCommand, "
                "shell of the user)"};
  }
  return false;
}

StatusOr<StartResult> SshConnection::StartAndReadLine(
    const std::string& command, double timeout_s, SshFailure* failure,
    bool until_eof) {
  if (!OpenChannel(command, timeout_s, failure))
    return Unavailable(failure->message);
  StartResult result;
  std::string out;
  char buf[4096];
  const auto deadline =
      std::chrono::steady_clock::now() + base::Millis(timeout_s);
  while (true) {
    const int n = ssh_channel_read_timeout(channel_, buf, sizeof(buf), 0, 50);
    if (n > 0 && out.size() < kMaxRestBytes)
      out.append(buf, static_cast<size_t>(n));
    if (const size_t nl = out.find('\n');
        nl != std::string::npos && !until_eof) {
      result.first_line = out.substr(0, nl);
      return result;  // still running, channel open
    }
    int e;
    while ((e = ssh_channel_read_nonblocking(channel_, buf, sizeof(buf), 1)) >
           0) {
      result.errors.append(buf, static_cast<size_t>(e));
    }
    if (n < 0 || ssh_channel_is_eof(channel_)) break;
    if (std::chrono::steady_clock::now() > deadline) {
      *failure = TimeoutFailure(SshStep::kRunAgent, host_, timeout_s);
      return DeadlineExceeded(failure->message);
    }
  }
  const size_t nl = out.find('\n');
  result.first_line = out.substr(0, nl);
  if (nl != std::string::npos) result.rest = out.substr(nl + 1);
  result.exit_status = ssh_channel_get_exit_status(channel_);
  while (!result.errors.empty() && result.errors.back() == '\n')
    result.errors.pop_back();
  return result;
}

Status SshConnection::WriteStdin(const std::string& data) {
  if (!channel_) return Internal("no command running");
  const int n = ssh_channel_write(channel_, data.data(),
                                  static_cast<uint32_t>(data.size()));
  if (n != static_cast<int>(data.size())) {
    return Unavailable(std::string("cannot write to the agent: ") +
                       ssh_get_error(session_));
  }
  return Status::Ok();
}

}  // namespace dslaunch::launcher
