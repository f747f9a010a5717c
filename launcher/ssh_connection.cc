#include "launcher/ssh_connection.h"

#include <netdb.h>       // getaddrinfo
#include <sys/socket.h>  // getsockname

#include <chrono>
#include <cstdlib>

#include "proto/host_info.h"

namespace dslaunch::launcher {

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
    local_address_ = proto::AddressToString(reinterpret_cast<sockaddr*>(&a));
  }
  len = sizeof(a);
  if (::getpeername(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0) {
    peer_address_ = proto::AddressToString(reinterpret_cast<sockaddr*>(&a));
  }
}

bool SshConnection::Open(const SshTarget& target, SshFailure* failure) {
  host_ = target.host;
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  if (int rc = ::getaddrinfo(target.host.c_str(), nullptr, &hints, &res);
      rc != 0) {
    *failure = {"resolve", gai_strerror(rc),
                "check the host name in the hostfile and DNS or /etc/hosts"};
    return false;
  }
  ::freeaddrinfo(res);
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
  const long timeout = static_cast<long>(target.timeout_s);
  ssh_options_set(session_, SSH_OPTIONS_TIMEOUT, &timeout);
  if (ssh_connect(session_) != SSH_OK) {
    *failure = {"connect", ssh_get_error(session_),
                "check that sshd runs on the node and the port is right"};
    return false;
  }
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
  *failure = {"auth",
              std::string("public key authentication refused: ") +
                  ssh_get_error(session_),
              "install your public key in the node's authorized_keys, or pass "
              "--ssh_identity / --ssh_user"};
  return false;
}

StatusOr<StartResult> SshConnection::StartAndReadLine(
    const std::string& command, double timeout_s) {
  channel_ = ssh_channel_new(session_);
  if (!channel_ || ssh_channel_open_session(channel_) != SSH_OK ||
      ssh_channel_request_exec(channel_, command.c_str()) != SSH_OK) {
    return Unavailable(std::string("cannot run a command: ") +
                       ssh_get_error(session_));
  }
  StartResult result;
  std::string out;
  char buf[4096];
  const auto deadline =
      std::chrono::steady_clock::now() +
      std::chrono::milliseconds(static_cast<int64_t>(timeout_s * 1000));
  while (true) {
    const int n = ssh_channel_read_timeout(channel_, buf, sizeof(buf), 0, 50);
    if (n > 0) out.append(buf, static_cast<size_t>(n));
    if (const size_t nl = out.find('\n'); nl != std::string::npos) {
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
      return DeadlineExceeded("no answer within " + std::to_string(timeout_s) +
                              " s");
    }
  }
  result.first_line = out;
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
