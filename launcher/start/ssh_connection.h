// SshConnection: one SSH connection to one node through libssh, with the
// checks of the preflight (name resolution, TCP connect, host key,
// authentication) reported as distinct failures with a hint. Every call
// blocks; the SshStarter makes them on a small thread pool, and the object is
// used by one thread at a time.
#pragma once

#include <libssh/libssh.h>

#include <string>
#include <utility>

#include "base/status.h"

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

// The steps of reaching a node and starting its agent, in order.
enum class SshStep {
  kResolve,      // name resolution
  kTcpConnect,   // TCP connect to the ssh port
  kHandshake,    // SSH banner and key exchange
  kHostKey,      // the host key against known_hosts
  kAuth,         // public-key authentication
  kOpenChannel,  // opening the session channel and starting the command
  kRunAgent,     // the command printing the agent's version line
};

// The preflight stage (doctor's column) a step belongs to: "resolve",
// "connect" (TCP connect, handshake), "host key", "auth", "agent" (channel,
// agent's version line).
const char* StageOf(SshStep step);

// The failure for `step` not finishing within `timeout_s` on `host`: the
// message names the step, the hint lists causes of that step only (sshd is
// named only where it can be the cause).
SshFailure TimeoutFailure(SshStep step, const std::string& host,
                          double timeout_s);

struct StartResult {
  std::string first_line;  // the command's first line of stdout
  int exit_status = -1;    // -1 while it runs; else how it ended
  std::string errors;      // its stderr, when it ended
  std::string rest;        // until_eof: its stdout after the first line
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
  // Starts `command` and reads its stdout up to the first newline. If the
  // command ends first, the result carries its exit status and stderr.
  // The channel stays open: its stdin is the remote agent's lifeline. On
  // error fills *failure (stage "agent", naming the step that failed).
  // With `until_eof`, reads on to the command's end (the doctor's checks)
  // and keeps what followed the first line in `rest`. At most
  // kMaxRestBytes of stdout are kept either way.
  static constexpr size_t kMaxRestBytes = 64u << 10;
  StatusOr<StartResult> StartAndReadLine(const std::string& command,
                                         double timeout_s, SshFailure* failure,
                                         bool until_eof = false);
  // Writes to the running command's stdin (the job secret).
  Status WriteStdin(const std::string& data);
  void Close();

  ssh_session session() const { return session_; }
  ssh_channel channel() const { return channel_; }
  // This side's address of the connection: the route that reaches the node.
  const std::string& local_address() const { return local_address_; }
  const std::string& peer_address() const { return peer_address_; }
  const std::string& host() const { return host_; }

 private:
  bool Resolve(const SshTarget& target, SshFailure* failure);
  bool Connect(const SshTarget& target, SshFailure* failure);
  bool CheckHostKey(const SshTarget& target, SshFailure* failure);
  bool Authenticate(const SshTarget& target, SshFailure* failure);
  void ReadAddresses();
  bool OpenChannel(const std::string& command, double timeout_s,
                   SshFailure* failure);

  ssh_session session_ = nullptr;
  ssh_channel channel_ = nullptr;
  std::string host_;
  std::string local_address_;
  std::string peer_address_;
};

// Quotes one word for a POSIX shell: 'word', with ' written as '\''.
std::string ShellQuote(const std::string& word);

}  // namespace dslaunch::launcher
