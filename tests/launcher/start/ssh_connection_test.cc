#include "launcher/start/ssh_connection.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "launcher/start/ssh_starter.h"

namespace dslaunch::launcher {
namespace {

TEST(ShellQuote, QuotesEveryWordSoNothingIsEvaluated) {
  EXPECT_EQ(ShellQuote("plain"), "'plain'");
  EXPECT_EQ(ShellQuote(""), "''");
  EXPECT_EQ(ShellQuote("it's"), "'it'\\''s'");
  EXPECT_EQ(ShellQuote("$(rm -rf /) `id` *"), "'$(rm -rf /) `id` *'");
}

TEST(SshTargets, HostfileOverridesFlags) {
  LaunchOptions o;
  o.ssh_port = 2200;
  o.ssh_user = "flaguser";
  o.ssh_host_key_check = "accept-new";
  Plan plan;
  NodePlan a;
  a.host = "a";
  NodePlan b;
  b.host = "b";
  b.ssh_port = 22;
  b.ssh_user = "fileuser";
  plan.nodes = {a, b};
  auto t = SshTargets(o, plan);
  ASSERT_EQ(t.size(), 2u);
  EXPECT_EQ(t[0].port, 2200);
  EXPECT_EQ(t[0].user, "flaguser");
  EXPECT_EQ(t[1].port, 22);
  EXPECT_EQ(t[1].user, "fileuser");
  EXPECT_EQ(t[1].check, HostKeyCheck::kAcceptNew);
}

TEST(SshConnection, UnresolvableHostFailsAtResolve) {
  SshConnection c;
  SshTarget t;
  t.host = "no-such-host.invalid";
  SshFailure f;
  EXPECT_FALSE(c.Open(t, &f));
  EXPECT_EQ(f.stage, "resolve");
  EXPECT_FALSE(f.hint.empty());
}

TEST(SshConnection, RefusedPortFailsAtConnect) {
  SshConnection c;
  SshTarget t;
  t.host = "127.0.0.1";
  t.port = 1;  // nothing listens there
  t.timeout_s = 2;
  SshFailure f;
  EXPECT_FALSE(c.Open(t, &f));
  EXPECT_EQ(f.stage, "connect");
}

bool Contains(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

TEST(SshTimeoutFailure, NamesTheStepTheHostAndTheTimeout) {
  struct Case {
    SshStep step;
    const char* stage;
    const char* names;
  };
  const Case cases[] = {
      {SshStep::kResolve, "resolve", "resolving node7 timed out"},
      {SshStep::kTcpConnect, "connect", "TCP connect to node7 timed out"},
      {SshStep::kHandshake, "connect", "SSH handshake with node7 timed out"},
      {SshStep::kHostKey, "host key", "host key of node7 timed out"},
      {SshStep::kAuth, "auth", "authentication on node7 timed out"},
      {SshStep::kOpenChannel, "agent",
       "opening a session to run the agent "
       "on node7 timed out"},
      {SshStep::kRunAgent, "agent", "version line from node7 timed out"},
  };
  for (const Case& c : cases) {
    SshFailure f = TimeoutFailure(c.step, "node7", 2.5);
    EXPECT_EQ(f.stage, c.stage);
    EXPECT_TRUE(Contains(f.message, c.names)) << f.message;
    EXPECT_TRUE(Contains(f.message, " timed out after 2.5 s")) << f.message;
    EXPECT_FALSE(f.hint.empty());
  }
}

TEST(SshTimeoutFailure, BlamesSshdOnlyForStepsSshdCanCause) {
  for (SshStep step : {SshStep::kResolve, SshStep::kTcpConnect,
                       SshStep::kHostKey, SshStep::kAuth, SshStep::kRunAgent}) {
    SshFailure f = TimeoutFailure(step, "n", 1);
    EXPECT_FALSE(Contains(f.message + f.hint, "sshd")) << f.message << f.hint;
  }
  EXPECT_TRUE(
      Contains(TimeoutFailure(SshStep::kHandshake, "n", 1).hint, "sshd"));
  EXPECT_TRUE(
      Contains(TimeoutFailure(SshStep::kOpenChannel, "n", 1).hint, "sshd"));
}

// A listening socket on 127.0.0.1 that never accepts; its port.
class SilentListener {
 public:
  explicit SilentListener(int backlog) {
    fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof(a);
    EXPECT_EQ(::bind(fd_, reinterpret_cast<sockaddr*>(&a), len), 0);
    EXPECT_EQ(::listen(fd_, backlog), 0);
    ::getsockname(fd_, reinterpret_cast<sockaddr*>(&a), &len);
    port_ = ntohs(a.sin_port);
  }
  ~SilentListener() {
    for (int fd : clients_) ::close(fd);
    ::close(fd_);
  }
  // Connects (and keeps) `n` clients, filling the accept queue.
  void Fill(int n) {
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    a.sin_port = htons(static_cast<uint16_t>(port_));
    for (int i = 0; i < n; ++i) {
      int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
      ::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a));
      clients_.push_back(fd);
    }
  }
  int port() const { return port_; }

 private:
  int fd_ = -1;
  int port_ = 0;
  std::vector<int> clients_;
};

SshFailure OpenFailure(int port, double timeout_s, double* seconds) {
  SshConnection c;
  SshTarget t;
  t.host = "127.0.0.1";
  t.port = port;
  t.timeout_s = timeout_s;
  t.config_file = "/dev/null";
  SshFailure f;
  const auto start = std::chrono::steady_clock::now();
  EXPECT_FALSE(c.Open(t, &f));
  *seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
          .count();
  return f;
}

TEST(SshConnection, PeerThatAcceptsButNeverSpeaksIsAHandshakeTimeout) {
  SilentListener listener(16);  // the kernel completes the TCP handshake
  double seconds = 0;
  SshFailure f = OpenFailure(listener.port(), 0.5, &seconds);
  EXPECT_EQ(f.stage, "connect");
  EXPECT_EQ(f.message,
            "SSH handshake with 127.0.0.1 timed out after 0.5 s (the TCP "
            "connection was accepted)");
  EXPECT_LT(seconds, 5) << "a fractional --ssh_timeout must not become 10 s";
}

TEST(SshConnection, PortThatDropsTheSynIsATcpConnectTimeout) {
  SilentListener listener(0);
  listener.Fill(4);  // accept queue full: further SYNs are dropped
  double seconds = 0;
  SshFailure f = OpenFailure(listener.port(), 1, &seconds);
  EXPECT_EQ(f.stage, "connect");
  EXPECT_EQ(f.message,
            "TCP connect to 127.0.0.1 timed out after 1 s (no answer at all)");
  EXPECT_FALSE(Contains(f.message + f.hint, "sshd")) << f.hint;
  EXPECT_LT(seconds, 5);
}

}  // namespace
}  // namespace dslaunch::launcher
