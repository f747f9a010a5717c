// SshConnection: one SSH connection to one node through libssh, with the
// checks of the preflight (name resolution, TCP connect, host key,
// authentication) reported as distinct failures with a hint. Every call
// blocks; the SshStarter makes them on a small thread pool, and the object is
// used by one thread at a time.
#pragma once

#include <libssh/libssh.h>

#include <string>
#include <utility>

#include "proto/status.h"

namespace dslaunch::launcher {

enum class HostKeyCheck { kStrict, kAcceptNew, kOff };

struct SshTarget {
  std::string host;
  int port = 0;             // 0 = from ~/.ssh/config or 22
  std::string user;         // empty = from config or the current user
  std::string identity;     // empty = default keys and ssh-agent
  std::string config_file;  // empty = ~/.ssh/config
  std::string known_hosts;  // empty = ~/.ssh/known_hosts
  HostKeyCheck check = HostKeyCheck::kStrict;
  double timeout_s = 10;
};

// Which step of reaching a node failed.
struct SshFailure {
  std::string stage;    // "resolve", "connect", "host key", "auth", "agent"
  std::string message;  // what happened
  std::string hint;     // what to do about it
};

class SshConnection {
 public:
  SshConnection() = default;
  ~SshConnection();
  SshConnection(const SshConnection&) = delete;
  SshConnection& operator=(const SshConnection&) = delete;

  // Resolves, connects, verifies the host key and authenticates. On failure
  // fills *failure and returns false.
  bool Open(const SshTarget& target, SshFailure* failure);
  // Runs `command` to completion; returns its exit status and stdout.
  StatusOr<std::pair<int, std::string>> Run(const std::string& command,
                                            double timeout_s);
  // Starts `command`, writes `stdin_data` to its stdin and keeps stdin open
  // (the remote agent's lifeline) until Close().
  Status Start(const std::string& command, const std::string& stdin_data);
  void Close();

  ssh_session session() const { return session_; }
  ssh_channel channel() const { return channel_; }
  // This side's address of the connection: the route that reaches the node.
  const std::string& local_address() const { return local_address_; }
  const std::string& peer_address() const { return peer_address_; }
  const std::string& host() const { return host_; }

 private:
  bool CheckHostKey(const SshTarget& target, SshFailure* failure);
  bool Authenticate(const SshTarget& target, SshFailure* failure);
  void ReadAddresses();

  ssh_session session_ = nullptr;
  ssh_channel channel_ = nullptr;
  std::string host_;
  std::string local_address_;
  std::string peer_address_;
};

// Quotes one word for a POSIX shell: 'word', with ' written as '\''.
std::string ShellQuote(const std::string& word);

}  // namespace dslaunch::launcher
