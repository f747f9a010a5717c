#include "launcher/supervise/control_server.h"

#include <gtest/gtest.h>
#include <spdlog/sinks/ostream_sink.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <array>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/write.hpp>
#include <chrono>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "proto/auth.h"
#include "proto/channel.h"
#include "proto/version.h"
#include "tests/common/run_until.h"

namespace dslaunch::launcher {
namespace {

namespace asio = boost::asio;
using asio::ip::tcp;
using dslaunch::testing::RunUntil;

constexpr char kSecret[] = "the job secret";

struct FakeDelegate : ControlServer::Delegate {
  std::vector<int> authenticated;
  std::vector<int> disconnected;
  int messages = 0;
  void OnAgentAuthenticated(int node, const wire::Hello&,
                            const std::string&) override {
    authenticated.push_back(node);
  }
  void OnAgentMessage(int, wire::Envelope&&) override { ++messages; }
  void OnAgentDisconnected(int node, const Status&) override {
    disconnected.push_back(node);
  }
};

// A peer that connected and then only watches for the server closing it.
struct RawPeer {
  explicit RawPeer(asio::io_context& io) : socket(io) {}
  tcp::socket socket;
  std::array<char, 256> buf;
  bool closed = false;
  void Watch() {
    socket.async_read_some(asio::buffer(buf),
                           [this](boost::system::error_code ec, size_t) {
                             if (ec)
                               closed = true;
                             else
                               Watch();
                           });
  }
};

// An agent-side client: a Channel that runs the handshake on request.
struct TestAgent {
  std::shared_ptr<proto::Channel> channel;
  std::vector<wire::Envelope> received;
  bool closed = false;
  std::string nonce = proto::RandomBytes(proto::kNonceBytes);

  void SendHello(int node, const std::string& job = "job-1",
                 int addresses = 0) {
    wire::Envelope env;
    auto* hello = env.mutable_hello();
    for (int i = 0; i < addresses; ++i) {
      hello->mutable_facts()->add_addresses("fd00:1234:5678:9abc::" +
                                            std::to_string(i));
    }
    hello->set_protocol_version(kProtocolVersion);
    hello->set_node_rank(node);
    hello->set_job_id(job);
    hello->set_client_nonce(nonce);
    ASSERT_TRUE(channel->Send(env).ok());
  }
  bool welcomed() const {
    return !received.empty() && received[0].has_welcome();
  }
  void SendAuth(const std::string& secret) {
    const wire::Welcome& w = received.at(0).welcome();
    EXPECT_EQ(w.launcher_proof(),
              proto::LauncherProof(kSecret, nonce, w.server_nonce()));
    wire::Envelope env;
    env.mutable_auth()->set_agent_proof(
        proto::AgentProof(secret, nonce, w.server_nonce()));
    ASSERT_TRUE(channel->Send(env).ok());
  }
};

class ControlServerTest : public ::testing::Test {
 protected:
  ControlServerTest() {
    options_.secret = kSecret;
    options_.job_id = "job-1";
    options_.num_nodes = 2;
    options_.heartbeat_interval_s = 0.05;
    options_.heartbeat_timeout_s = 0.3;
    options_.handshake_timeout_s = 5;
    options_.rejection_summary_interval_s = 0.2;
  }
  ~ControlServerTest() override {
    if (server_) server_->Shutdown();
  }

  void StartServer() {
    server_ = std::make_unique<ControlServer>(io_, options_, &delegate_);
    StatusOr<int> port =
        server_->Listen(std::vector<std::string>{"127.0.0.1"}, 0);
    ASSERT_TRUE(port.ok()) << port.status().message();
    port_ = *port;
  }
  // From `source`, a loopback address (127.0.0.1 unless another is named).
  tcp::socket Connect(const std::string& source = "") {
    tcp::socket s(io_);
    if (!source.empty()) {
      s.open(tcp::v4());
      s.bind(tcp::endpoint(asio::ip::make_address(source), 0));
    }
    s.connect(tcp::endpoint(asio::ip::make_address("127.0.0.1"),
                            static_cast<unsigned short>(port_)));
    return s;
  }
  std::unique_ptr<RawPeer> Raw() {
    auto p = std::make_unique<RawPeer>(io_);
    p->socket = Connect();
    p->Watch();
    return p;
  }
  std::unique_ptr<TestAgent> Agent(const std::string& source = "") {
    auto a = std::make_unique<TestAgent>();
    a->channel =
        proto::Channel::Create(proto::Channel::Socket(Connect(source)), "a");
    TestAgent* raw = a.get();
    a->channel->Start({
        .on_message = [raw](wire::Envelope&& m) { raw->received.push_back(m); },
        .on_close = [raw](const Status&) { raw->closed = true; },
        .on_drain = nullptr,
    });
    return a;
  }
  // Hello, Welcome, Auth with `secret`; true once the server answered.
  bool Handshake(TestAgent& a, int node, const std::string& secret) {
    a.SendHello(node);
    if (!RunUntil(io_, [&] { return a.welcomed() || a.closed; })) return false;
    if (a.closed) return false;
    a.SendAuth(secret);
    return true;
  }
  int64_t Rejected(const std::string& reason) {
    auto it = server_->rejections().find(reason);
    return it == server_->rejections().end() ? 0 : it->second;
  }

  asio::io_context io_;
  ControlServer::Options options_;
  FakeDelegate delegate_;
  std::unique_ptr<ControlServer> server_;
  int port_ = 0;
};

TEST_F(ControlServerTest, AuthenticatesAgentWithTheRightSecret) {
  StartServer();
  auto a = Agent();
  ASSERT_TRUE(Handshake(*a, 1, kSecret));
  ASSERT_TRUE(RunUntil(io_, [&] { return !delegate_.authenticated.empty(); }));
  EXPECT_EQ(delegate_.authenticated, std::vector<int>{1});
  EXPECT_TRUE(server_->connected(1));
  EXPECT_EQ(server_->pending_handshakes(), 0u);
  EXPECT_FALSE(a->closed);
}

// Where each node has its own secret (pdsh, srun, mpirun), a Hello that
// comes before its node's secret waits for it, and is answered as soon as
// the secret is known (no polling), with a proof of that secret.
TEST_F(ControlServerTest,
       AHelloWaitsForItsNodesSecretAndIsAnsweredWhenItComes) {
  std::optional<std::string> node1;
  options_.node_secret = [&](int node) -> std::optional<std::string> {
    if (node == 1) return node1;
    return std::nullopt;
  };
  StartServer();
  auto a = Agent();
  a->SendHello(1);
  auto b = Agent();
  b->SendHello(0);  // its node's secret never comes: it waits, then times out
  RunUntil(
      io_, [&] { return a->welcomed() || a->closed; },
      std::chrono::milliseconds(200));
  EXPECT_FALSE(a->welcomed());
  EXPECT_FALSE(a->closed);
  node1 = kSecret;
  server_->NodeSecretKnown(1);
  ASSERT_TRUE(RunUntil(io_, [&] { return a->welcomed() || a->closed; }));
  ASSERT_TRUE(a->welcomed());
  a->SendAuth(kSecret);  // checks the Welcome's proof of the node's secret
  ASSERT_TRUE(RunUntil(io_, [&] { return !delegate_.authenticated.empty(); }));
  EXPECT_EQ(delegate_.authenticated, std::vector<int>{1});
  EXPECT_FALSE(b->welcomed());
  server_->NodeSecretKnown(0);  // still unknown: nothing to answer with
  RunUntil(
      io_, [&] { return b->welcomed(); }, std::chrono::milliseconds(100));
  EXPECT_FALSE(b->welcomed());
}

TEST_F(ControlServerTest, WelcomesAHelloListingManyAddresses) {
  StartServer();
  auto a = Agent();
  a->SendHello(0, "job-1", 300);  // ~9 KB
  ASSERT_TRUE(RunUntil(io_, [&] { return a->welcomed() || a->closed; }));
  EXPECT_TRUE(a->welcomed());
}

TEST_F(ControlServerTest, RefusesWrongSecret) {
  StartServer();
  auto a = Agent();
  ASSERT_TRUE(Handshake(*a, 0, "not the secret"));
  ASSERT_TRUE(RunUntil(io_, [&] { return a->closed; }));
  EXPECT_TRUE(delegate_.authenticated.empty());
  EXPECT_FALSE(server_->connected(0));
  EXPECT_EQ(Rejected("authentication failed"), 1);
}

TEST_F(ControlServerTest, RefusesHelloOfAnotherJobOrUnknownNode) {
  StartServer();
  auto other_job = Agent();
  other_job->SendHello(0, "job-2");
  auto bad_node = Agent();
  bad_node->SendHello(2);
  ASSERT_TRUE(
      RunUntil(io_, [&] { return other_job->closed && bad_node->closed; }));
  EXPECT_FALSE(other_job->welcomed());
  EXPECT_EQ(Rejected("bad hello"), 2);
}

TEST_F(ControlServerTest, RefusesASecondAgentForANode) {
  StartServer();
  auto first = Agent();
  ASSERT_TRUE(Handshake(*first, 0, kSecret));
  ASSERT_TRUE(RunUntil(io_, [&] { return server_->connected(0); }));
  auto second = Agent();
  ASSERT_TRUE(Handshake(*second, 0, kSecret));
  ASSERT_TRUE(RunUntil(io_, [&] { return second->closed; }));
  EXPECT_EQ(delegate_.authenticated, std::vector<int>{0});
  EXPECT_FALSE(first->closed);
  EXPECT_TRUE(server_->connected(0));
}

// --launcher join: the node is given at authentication.
class JoinServerTest : public ControlServerTest {
 protected:
  JoinServerTest() {
    options_.join = true;
    options_.num_nodes = 3;
  }
  // An agent that joined claiming `claim`, as a joining dsagent does (it
  // knows no job id).
  std::unique_ptr<TestAgent> Joined(int claim, bool* ok) {
    auto a = Agent();
    a->SendHello(claim, "join");
    *ok =
        RunUntil(io_, [&] { return a->welcomed() || a->closed; }) && !a->closed;
    if (*ok) a->SendAuth(kSecret);
    return a;
  }
  // The reason of the Abort `a` got, or "".
  static std::string Refusal(const TestAgent& a) {
    for (const auto& m : a.received) {
      if (m.has_abort()) return m.abort().reason();
    }
    return "";
  }
};

TEST_F(JoinServerTest, GivesTheClaimedNodeElseTheLowestFree) {
  StartServer();
  bool ok = false;
  auto two = Joined(2, &ok);
  ASSERT_TRUE(ok);
  ASSERT_TRUE(RunUntil(io_, [&] { return server_->connected(2); }));
  auto any = Joined(-1, &ok);
  ASSERT_TRUE(ok);
  ASSERT_TRUE(RunUntil(io_, [&] { return server_->connected(0); }));
  auto any2 = Joined(-1, &ok);
  ASSERT_TRUE(ok);
  ASSERT_TRUE(RunUntil(io_, [&] { return server_->connected(1); }));
  EXPECT_EQ(delegate_.authenticated, (std::vector<int>{2, 0, 1}));
  EXPECT_FALSE(two->closed || any->closed || any2->closed);
}

TEST_F(JoinServerTest, RefusesATakenNodeNamingItsHolderAndLeavesItAlone) {
  StartServer();
  bool ok = false;
  auto first = Joined(1, &ok);
  ASSERT_TRUE(ok);
  ASSERT_TRUE(RunUntil(io_, [&] { return server_->connected(1); }));
  auto second = Joined(1, &ok);
  ASSERT_TRUE(ok);
  ASSERT_TRUE(RunUntil(io_, [&] { return second->closed; }));
  EXPECT_NE(Refusal(*second).find("node rank 1 is taken by the agent on ? "
                                  "(127.0.0.1)"),
            std::string::npos)
      << Refusal(*second);
  EXPECT_EQ(delegate_.authenticated, std::vector<int>{1});
  EXPECT_FALSE(first->closed);
  EXPECT_TRUE(server_->connected(1));
}

TEST_F(JoinServerTest, RefusesAClaimOutOfRangeAndAnAgentTooMany) {
  StartServer();
  bool ok = false;
  auto out = Joined(3, &ok);
  ASSERT_TRUE(ok);
  ASSERT_TRUE(RunUntil(io_, [&] { return out->closed; }));
  EXPECT_NE(Refusal(*out).find("this job has 3 nodes (node ranks 0-2); this "
                               "agent claims node rank 3"),
            std::string::npos)
      << Refusal(*out);
  std::vector<std::unique_ptr<TestAgent>> agents;
  for (int i = 0; i < 3; ++i) {
    agents.push_back(Joined(-1, &ok));
    ASSERT_TRUE(ok);
  }
  ASSERT_TRUE(
      RunUntil(io_, [&] { return delegate_.authenticated.size() == 3; }));
  auto extra = Joined(-1, &ok);
  ASSERT_TRUE(ok);
  ASSERT_TRUE(RunUntil(io_, [&] { return extra->closed; }));
  EXPECT_NE(Refusal(*extra).find("every node rank of this job (3) is taken"),
            std::string::npos);
  EXPECT_EQ(delegate_.authenticated.size(), 3u);
}

// Hellos claiming "any node" are welcomed, never authenticated: the
// pre-auth table stays bounded (the oldest are evicted) and an agent that
// proves the secret still gets in.
TEST_F(JoinServerTest, AFloodOfHellosNeverGrowsTheTableAndAnAgentGetsIn) {
  options_.num_nodes = 1;
  StartServer();
  const size_t limit =
      ControlServer::kPreAuthBase + ControlServer::kPreAuthPerNode * 1;
  std::vector<std::unique_ptr<TestAgent>> flood;
  for (size_t i = 0; i < limit + 40; ++i) {
    flood.push_back(Agent());
    flood.back()->SendHello(i % 2 ? -1 : 1000 + static_cast<int>(i), "join");
  }
  ASSERT_TRUE(RunUntil(io_, [&] {
    size_t done = 0;
    for (auto& a : flood) done += a->welcomed() || a->closed;
    return done == flood.size();
  }));
  EXPECT_LE(server_->pending_handshakes(), limit);
  EXPECT_GT(Rejected("evicted (pre-auth table full)"), 0);
  bool ok = false;
  auto agent = Joined(-1, &ok);
  ASSERT_TRUE(ok);
  ASSERT_TRUE(RunUntil(io_, [&] { return server_->connected(0); }));
  EXPECT_EQ(delegate_.authenticated, std::vector<int>{0});
}

// Unauthenticated Hellos claiming node rank 0, however many, do not keep a
// real agent claiming it out: only its proof counts.
TEST_F(JoinServerTest, HellosClaimingNodeZeroDoNotKeepTheRealAgentOut) {
  StartServer();
  auto agent = Agent();
  agent->SendHello(0, "join");
  ASSERT_TRUE(RunUntil(io_, [&] { return agent->welcomed(); }));
  std::vector<std::unique_ptr<TestAgent>> claims;
  for (int i = 0; i < 10; ++i) {
    claims.push_back(Agent());
    claims.back()->SendHello(0, "join");
  }
  ASSERT_TRUE(RunUntil(io_, [&] {
    return std::all_of(claims.begin(), claims.end(),
                       [](const auto& c) { return c->welcomed(); });
  }));
  agent->SendAuth(kSecret);
  ASSERT_TRUE(RunUntil(io_, [&] { return server_->connected(0); }));
  EXPECT_EQ(delegate_.authenticated, std::vector<int>{0});
}

TEST_F(JoinServerTest, AWrongSecretGetsNoNodeAndNoWord) {
  StartServer();
  auto a = Agent();
  a->SendHello(-1, "join");
  ASSERT_TRUE(RunUntil(io_, [&] { return a->welcomed() || a->closed; }));
  a->SendAuth("not the secret");
  ASSERT_TRUE(RunUntil(io_, [&] { return a->closed; }));
  EXPECT_TRUE(delegate_.authenticated.empty());
  EXPECT_EQ(Refusal(*a), "");
  EXPECT_EQ(Rejected("authentication failed"), 1);
}

TEST_F(JoinServerTest, OutsideJoinAClaimOfAnyNodeIsABadHello) {
  options_.join = false;
  StartServer();
  auto a = Agent();
  a->SendHello(-1);
  ASSERT_TRUE(RunUntil(io_, [&] { return a->closed; }));
  EXPECT_EQ(Rejected("bad hello"), 1);
}

TEST_F(ControlServerTest, ClosesAPreAuthFrameOverSixteenKiB) {
  StartServer();
  auto p = Raw();
  const uint32_t len = 16 * 1024 + 1;
  const std::string header{static_cast<char>(len >> 24),
                           static_cast<char>(len >> 16),
                           static_cast<char>(len >> 8), static_cast<char>(len)};
  asio::write(p->socket, asio::buffer(header + std::string(100, 'x')));
  ASSERT_TRUE(RunUntil(io_, [&] { return p->closed; }));
  EXPECT_EQ(Rejected("malformed input"), 1);
}

TEST_F(ControlServerTest, ClosesASilentConnectionAtTheHandshakeDeadline) {
  options_.handshake_timeout_s = 0.3;
  StartServer();
  const auto start = std::chrono::steady_clock::now();
  auto p = Raw();
  ASSERT_TRUE(RunUntil(io_, [&] { return p->closed; }));
  EXPECT_GE(std::chrono::steady_clock::now() - start,
            std::chrono::milliseconds(290));
  EXPECT_EQ(Rejected("timed out"), 1);
  EXPECT_EQ(server_->pending_handshakes(), 0u);
}

TEST_F(ControlServerTest, FullTableEvictsTheOldestSilentPeerAndLetsTheAgentIn) {
  StartServer();
  const size_t limit = ControlServer::kPreAuthBase +
                       ControlServer::kPreAuthPerNode * options_.num_nodes;
  auto waiting = Agent();  // sent a valid Hello, not evicted for silent ones
  waiting->SendHello(1);
  ASSERT_TRUE(RunUntil(io_, [&] { return waiting->welcomed(); }));
  std::vector<std::unique_ptr<RawPeer>> idle;
  for (size_t i = 0; i + 1 < limit; ++i) idle.push_back(Raw());
  ASSERT_TRUE(
      RunUntil(io_, [&] { return server_->pending_handshakes() == limit; }));
  for (int i = 0; i < 3; ++i) idle.push_back(Raw());
  auto agent = Agent();
  ASSERT_TRUE(Handshake(*agent, 0, kSecret));
  ASSERT_TRUE(RunUntil(io_, [&] { return server_->connected(0); }));
  // Four newcomers (three idle and the agent) evicted the four oldest idle.
  EXPECT_EQ(Rejected("evicted (pre-auth table full)"), 4);
  for (size_t i = 0; i < idle.size(); ++i)
    EXPECT_EQ(idle[i]->closed, i < 4) << i;
  EXPECT_FALSE(waiting->closed);
  EXPECT_LE(server_->pending_handshakes(), limit);
}

// Only a proven claim takes a node: Hellos claiming the node an agent is
// proving never evict it, however many.
TEST_F(ControlServerTest, HellosClaimingANodeNeverEvictTheAgentProvingIt) {
  StartServer();
  auto agent = Agent();
  agent->SendHello(0);
  ASSERT_TRUE(RunUntil(io_, [&] { return agent->welcomed(); }));
  std::vector<std::unique_ptr<TestAgent>> claims;
  for (int i = 0; i < 20; ++i) {
    claims.push_back(Agent());
    claims.back()->SendHello(0);
  }
  ASSERT_TRUE(RunUntil(io_, [&] {
    return std::all_of(claims.begin(), claims.end(),
                       [](const auto& c) { return c->welcomed(); });
  }));
  agent->SendAuth(kSecret);
  ASSERT_TRUE(RunUntil(io_, [&] { return server_->connected(0); }));
  EXPECT_FALSE(agent->closed);
  EXPECT_EQ(delegate_.authenticated, std::vector<int>{0});
}

// A full table takes from the address holding the most: a flood of valid
// Hellos from one address never evicts an agent from another, even when
// the agent's handshake is the oldest.
TEST_F(ControlServerTest, AFloodFromOneAddressNeverEvictsAnAgentFromAnother) {
  StartServer();
  const size_t limit = ControlServer::kPreAuthBase +
                       ControlServer::kPreAuthPerNode * options_.num_nodes;
  auto agent = Agent("127.0.0.2");
  agent->SendHello(1);
  ASSERT_TRUE(RunUntil(io_, [&] { return agent->welcomed(); }));
  std::vector<std::unique_ptr<TestAgent>> flood;
  for (size_t i = 0; i < limit + 20; ++i) {
    flood.push_back(Agent("127.0.0.1"));
    flood.back()->SendHello(static_cast<int>(i % 2));
  }
  ASSERT_TRUE(RunUntil(io_, [&] {
    return std::all_of(flood.begin(), flood.end(), [](const auto& c) {
      return c->welcomed() || c->closed;
    });
  }));
  EXPECT_EQ(Rejected("evicted (pre-auth table full)"), 21);
  EXPECT_FALSE(agent->closed);
  agent->SendAuth(kSecret);
  ASSERT_TRUE(RunUntil(io_, [&] { return server_->connected(1); }));
  EXPECT_LE(server_->pending_handshakes(), limit);
}

// What an unauthenticated peer sends reaches the log escaped and cut short:
// no escape sequence, no forged line.
TEST_F(ControlServerTest, LogsAHostileHelloEscapedAndCutShort) {
  std::ostringstream log;
  auto sink = std::make_shared<spdlog::sinks::ostream_sink_mt>(log);
  auto previous = spdlog::default_logger();
  spdlog::set_default_logger(std::make_shared<spdlog::logger>("test", sink));
  options_.rejection_summary_interval_s = 0.1;
  StartServer();
  auto a = Agent();
  wire::Envelope env;
  env.mutable_hello()->set_protocol_version(kProtocolVersion + 1);
  env.mutable_hello()->set_agent_version(
      "\x1b[2J\x1b]0;owned\x07\n[2026-11-27 00:00:00.000] [info] forged line"
      "\xe2\x80\xae" +
      std::string(5000, 'v'));
  ASSERT_TRUE(a->channel->Send(env).ok());
  const bool logged = RunUntil(
      io_, [&] { return log.str().find("rejected") != std::string::npos; });
  spdlog::set_default_logger(previous);
  ASSERT_TRUE(logged);
  const std::string text = log.str();
  EXPECT_EQ(std::count(text.begin(), text.end(), '\n'), 1) << text;
  EXPECT_EQ(text.find('\x1b'), std::string::npos) << text;
  EXPECT_EQ(text.find('\x07'), std::string::npos) << text;
  EXPECT_EQ(text.find("\xe2\x80\xae"), std::string::npos) << text;
  EXPECT_NE(text.find("\\u001b[2J"), std::string::npos) << text;
  EXPECT_NE(text.find("\\u202e"), std::string::npos) << text;
  EXPECT_LT(text.size(), 1000u) << "the version was not cut short";
}

TEST_F(ControlServerTest, DropsAnAgentWhoseHeartbeatsStop) {
  StartServer();
  auto a = Agent();  // never answers the server's heartbeats
  ASSERT_TRUE(Handshake(*a, 0, kSecret));
  ASSERT_TRUE(RunUntil(io_, [&] { return server_->connected(0); }));
  ASSERT_TRUE(RunUntil(io_, [&] { return !delegate_.disconnected.empty(); }));
  EXPECT_EQ(delegate_.disconnected, std::vector<int>{0});
  EXPECT_FALSE(server_->connected(0));
  EXPECT_TRUE(RunUntil(io_, [&] { return a->closed; }));
}

TEST_F(ControlServerTest, SummarisesRejectionsInOneLinePerInterval) {
  std::ostringstream log;
  auto sink = std::make_shared<spdlog::sinks::ostream_sink_mt>(log);
  auto previous = spdlog::default_logger();
  spdlog::set_default_logger(std::make_shared<spdlog::logger>("test", sink));
  options_.rejection_summary_interval_s = 0.5;
  StartServer();
  std::vector<std::unique_ptr<RawPeer>> peers;
  for (int i = 0; i < 30; ++i) {
    peers.push_back(Raw());
    asio::write(peers.back()->socket, asio::buffer(std::string("GET /\r\n")));
  }
  const bool logged = RunUntil(
      io_, [&] { return log.str().find("rejected") != std::string::npos; });
  spdlog::set_default_logger(previous);
  ASSERT_TRUE(logged);
  const std::string text = log.str();
  EXPECT_EQ(std::count(text.begin(), text.end(), '\n'), 1) << text;
  EXPECT_NE(text.find("rejected 30 unauthenticated connection(s)"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("30 malformed input"), std::string::npos) << text;
}

}  // namespace
}  // namespace dslaunch::launcher
