#include "launcher/report/metrics_server.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <boost/asio/io_context.hpp>
#include <cerrno>
#include <chrono>
#include <string>
#include <vector>

namespace dslaunch::launcher {
namespace {

using std::chrono::milliseconds;
using Clock = std::chrono::steady_clock;

// The server and its clients share this thread: the clients never block,
// and the loop runs while they wait.
class MetricsServerTest : public ::testing::Test {
 protected:
  void Start(MetricsServer::Options options = {}) {
    server_ = std::make_unique<MetricsServer>(
        io_, [this] { return std::make_shared<const std::string>(body_); },
        options);
    auto port = server_->Listen("127.0.0.1", 0);
    ASSERT_TRUE(port.ok()) << port.status().message();
    port_ = *port;
  }
  void TearDown() override {
    for (int fd : fds_) ::close(fd);
  }

  void RunFor(milliseconds d) {
    if (io_.stopped()) io_.restart();
    io_.run_for(d);
  }
  template <typename Pred>
  bool RunUntil(Pred done, milliseconds limit = milliseconds(3000)) {
    const auto deadline = Clock::now() + limit;
    while (!done() && Clock::now() < deadline) RunFor(milliseconds(5));
    return done();
  }

  // A connection from `from` (an IPv4 address in host order; 0: any).
  int Connect(uint32_t from = 0) {
    const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (from != 0) {
      sockaddr_in local{};
      local.sin_family = AF_INET;
      local.sin_addr.s_addr = htonl(from);
      EXPECT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&local), sizeof(local)),
                0)
          << strerror(errno);
    }
    sockaddr_in sa{};
    sa.sin_family = AF_INET;
    sa.sin_port = htons(static_cast<uint16_t>(port_));
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    EXPECT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&sa), sizeof(sa)), 0)
        << strerror(errno);
    fds_.push_back(fd);
    return fd;
  }
  static void Send(int fd, const std::string& data) {
    ASSERT_EQ(::send(fd, data.data(), data.size(), MSG_NOSIGNAL),
              static_cast<ssize_t>(data.size()));
  }
  // Everything until EOF (or a reset), running the loop meanwhile.
  std::string ReadToEof(int fd, milliseconds limit = milliseconds(3000)) {
    std::string got;
    char buf[65536];
    const auto deadline = Clock::now() + limit;
    while (Clock::now() < deadline) {
      const ssize_t n = ::recv(fd, buf, sizeof(buf), MSG_DONTWAIT);
      if (n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK)) {
        eof_ = true;
        return got;
      }
      if (n > 0)
        got.append(buf, static_cast<size_t>(n));
      else
        RunFor(milliseconds(2));
    }
    eof_ = false;
    return got;
  }
  std::string Fetch(const std::string& request) {
    const int fd = Connect();
    Send(fd, request);
    return ReadToEof(fd);
  }

  boost::asio::io_context io_;
  std::string body_ = "dslaunch_job_ranks 3\n";
  std::unique_ptr<MetricsServer> server_;
  int port_ = 0;
  std::vector<int> fds_;
  bool eof_ = false;
};

bool StartsWith(const std::string& s, const std::string& prefix) {
  return s.rfind(prefix, 0) == 0;
}
bool Has(const std::string& s, const std::string& what) {
  return s.find(what) != std::string::npos;
}

TEST_F(MetricsServerTest, ServesMetricsThenCloses) {
  Start();
  const std::string r = Fetch("GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n");
  EXPECT_TRUE(eof_);
  EXPECT_TRUE(StartsWith(r, "HTTP/1.1 200 OK\r\n")) << r;
  EXPECT_TRUE(
      Has(r, "\r\nContent-Type: text/plain; version=0.0.4; charset=utf-8\r\n"));
  EXPECT_TRUE(Has(r, "\r\nContent-Length: 21\r\n"));
  EXPECT_TRUE(Has(r, "\r\nConnection: close\r\n"));
  EXPECT_TRUE(r.ends_with("\r\n\r\ndslaunch_job_ranks 3\n")) << r;
  EXPECT_TRUE(RunUntil([&] { return server_->open_connections() == 0; }));
  EXPECT_EQ(server_->counts().responses, 1);
}

TEST_F(MetricsServerTest, Http10QueryStringHeadAndIndex) {
  Start();
  EXPECT_TRUE(StartsWith(Fetch("GET /metrics?x=1 HTTP/1.0\n\n"),
                         "HTTP/1.1 200 OK\r\n"));
  const std::string head = Fetch("HEAD /metrics HTTP/1.1\r\n\r\n");
  EXPECT_TRUE(StartsWith(head, "HTTP/1.1 200 OK\r\n")) << head;
  EXPECT_TRUE(Has(head, "Content-Length: 21\r\n"));
  EXPECT_TRUE(head.ends_with("\r\n\r\n")) << head;
  const std::string index = Fetch("GET / HTTP/1.1\r\n\r\n");
  EXPECT_TRUE(StartsWith(index, "HTTP/1.1 200 OK\r\n"));
  EXPECT_TRUE(Has(index, "href=\"/metrics\""));
}

TEST_F(MetricsServerTest, NotFoundMethodNotAllowedBadRequest) {
  Start();
  EXPECT_TRUE(StartsWith(Fetch("GET /nope HTTP/1.1\r\n\r\n"),
                         "HTTP/1.1 404 Not Found\r\n"));
  const std::string post = Fetch("POST /metrics HTTP/1.1\r\n\r\n");
  EXPECT_TRUE(StartsWith(post, "HTTP/1.1 405 Method Not Allowed\r\n"));
  EXPECT_TRUE(Has(post, "\r\nAllow: GET, HEAD\r\n"));
  using namespace std::string_literals;
  for (const std::string& bad :
       {"garbage\r\n\r\n"s, "GET /metrics HTTP/2.0\r\n\r\n"s,
        "GET metrics HTTP/1.1\r\n\r\n"s, "GET /metrics HTTP/1.1 x\r\n\r\n"s,
        "GET /metrics HTTP/1.1\r\nno colon here\r\n\r\n"s,
        "\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03\r\n\r\n"s}) {
    EXPECT_TRUE(StartsWith(Fetch(bad), "HTTP/1.1 400 Bad Request\r\n")) << bad;
  }
  EXPECT_EQ(server_->counts().bad_requests, 6);
}

TEST_F(MetricsServerTest, OversizeHeadIsRefused) {
  MetricsServer::Options o;
  o.max_head_bytes = 512;
  Start(o);
  const int fd = Connect();
  Send(fd, "GET /metrics HTTP/1.1\r\nX-Big: " + std::string(4000, 'a'));
  const std::string r = ReadToEof(fd);
  EXPECT_TRUE(eof_);
  // The 431 may be lost to the reset that closing with unread input makes.
  if (!r.empty()) {
    EXPECT_TRUE(StartsWith(r, "HTTP/1.1 431 ")) << r;
  }
  EXPECT_TRUE(RunUntil([&] { return server_->open_connections() == 0; }));
  EXPECT_EQ(server_->counts().bad_requests, 1);
}

TEST_F(MetricsServerTest, SlowClientIsCutAtTheReadDeadline) {
  MetricsServer::Options o;
  o.read_timeout = milliseconds(200);
  Start(o);
  const int fd = Connect();
  Send(fd, "GET /met");
  const auto start = Clock::now();
  EXPECT_EQ(ReadToEof(fd), "");
  EXPECT_TRUE(eof_);
  const auto took = Clock::now() - start;
  EXPECT_GE(took, milliseconds(150));
  EXPECT_LT(took, milliseconds(1500));
  EXPECT_EQ(server_->counts().timed_out, 1);
  EXPECT_EQ(server_->open_connections(), 0u);
}

TEST_F(MetricsServerTest, ClientThatNeverReadsIsCutAtTheWriteDeadline) {
  MetricsServer::Options o;
  o.write_timeout = milliseconds(200);
  Start(o);
  body_ = std::string(32 << 20, 'x');  // more than the socket buffers hold
  const int fd = Connect();
  const int small = 4096;
  ::setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &small, sizeof(small));
  Send(fd, "GET /metrics HTTP/1.1\r\n\r\n");
  EXPECT_TRUE(RunUntil([&] { return server_->counts().timed_out == 1; }));
  EXPECT_EQ(server_->open_connections(), 0u);
  EXPECT_EQ(server_->counts().responses, 0);
}

TEST_F(MetricsServerTest, ConnectionFloodIsBoundedAndServerStillAnswers) {
  MetricsServer::Options o;
  o.max_connections = 4;
  Start(o);
  std::vector<int> idle;
  for (int i = 0; i < 40; ++i) idle.push_back(Connect());
  EXPECT_TRUE(RunUntil([&] { return server_->counts().accepted == 40; }));
  EXPECT_EQ(server_->open_connections(), 4u);
  EXPECT_EQ(server_->counts().refused_full, 36);
  // Garbage from the idle ones: each gets a 400 and is closed.
  for (int fd : idle) (void)::send(fd, "\xff\xfe\r\n\r\n", 6, MSG_NOSIGNAL);
  EXPECT_TRUE(RunUntil([&] { return server_->open_connections() == 0; }));
  EXPECT_TRUE(StartsWith(Fetch("GET /metrics HTTP/1.1\r\n\r\n"),
                         "HTTP/1.1 200 OK\r\n"));
}

TEST_F(MetricsServerTest, IdleConnectionsHoldingItFullGiveWayToAScraper) {
  MetricsServer::Options o;
  o.max_connections = 4;
  o.read_timeout = std::chrono::milliseconds(60000);  // never the way out
  Start(o);
  for (int i = 0; i < 4; ++i) Connect();  // closed by TearDown
  EXPECT_TRUE(RunUntil([&] { return server_->open_connections() == 4; }));
  EXPECT_TRUE(StartsWith(Fetch("GET /metrics HTTP/1.1\r\n\r\n"),
                         "HTTP/1.1 200 OK\r\n"));
  EXPECT_EQ(server_->counts().refused_full, 1);
  EXPECT_EQ(server_->counts().timed_out, 0);
}

TEST_F(MetricsServerTest, ClientsThatNeverReadTheirAnswersGiveWayToAScraper) {
  // Every open connection asked and is being answered (a response larger
  // than the socket buffers, never read): the next one still gets in, the
  // oldest of them gives way, and each answer shares the one rendered text.
  MetricsServer::Options o;
  o.max_connections = 4;
  Start(o);
  body_ = std::string(8 << 20, 'x');
  for (int i = 0; i < 4; ++i) {
    const int fd = Connect();
    const int small = 4096;
    ::setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &small, sizeof(small));
    Send(fd, "GET /metrics HTTP/1.1\r\n\r\n");
  }
  // All four are being answered: their requests were read, the answers
  // wait for readers that never come.
  RunFor(milliseconds(200));
  EXPECT_EQ(server_->open_connections(), 4u);
  EXPECT_EQ(server_->counts().responses, 0);
  const std::string got = Fetch("GET /metrics HTTP/1.1\r\n\r\n");
  EXPECT_TRUE(StartsWith(got, "HTTP/1.1 200 OK\r\n")) << got.substr(0, 200);
  EXPECT_TRUE(eof_);
  EXPECT_EQ(got.size() - got.find("\r\n\r\n") - 4, body_.size());
  EXPECT_EQ(server_->counts().refused_full, 1);
}

TEST_F(MetricsServerTest, AFloodFromOneAddressDoesNotEvictAnotherAddress) {
  // The scraper comes from 127.0.0.2, the flood from 127.0.0.1; the flood
  // only ever evicts its own.
  MetricsServer::Options o;
  o.max_connections = 4;
  o.read_timeout = std::chrono::milliseconds(60000);
  Start(o);
  const int scraper = Connect(0x7F000002);
  EXPECT_TRUE(RunUntil([&] { return server_->open_connections() == 1; }));
  // The scraper's connection is the oldest; 20 newer ones come from .1.
  for (int i = 0; i < 20; ++i) Connect();
  EXPECT_TRUE(RunUntil([&] { return server_->counts().accepted == 21; }));
  EXPECT_EQ(server_->open_connections(), 4u);
  EXPECT_EQ(server_->counts().refused_full, 17);
  Send(scraper, "GET /metrics HTTP/1.1\r\n\r\n");
  EXPECT_TRUE(StartsWith(ReadToEof(scraper), "HTTP/1.1 200 OK\r\n"));
}

// Many addresses, one idle connection each, cannot push out a scraper whose
// request was read and whose answer is being written: connections still
// sending a request go first, whatever address they come from.
TEST_F(MetricsServerTest,
       AFloodFromManyAddressesNeverDropsAScraperBeingAnswered) {
  MetricsServer::Options o;
  o.max_connections = 4;
  o.read_timeout = std::chrono::milliseconds(60000);
  Start(o);
  // Its answer, more than the socket buffers hold, outlasts the flood.
  body_ = std::string(48 << 20, 'x');
  const int scraper = Connect(0x7F000001);
  Send(scraper, "GET /metrics HTTP/1.1\r\n\r\n");
  RunFor(milliseconds(100));  // its request is read, its answer waits
  ASSERT_EQ(server_->open_connections(), 1u);
  for (uint32_t i = 0; i < 20; ++i) Connect(0x7F000002 + i);
  EXPECT_TRUE(RunUntil([&] { return server_->counts().accepted == 21; }));
  EXPECT_EQ(server_->open_connections(), 4u);
  EXPECT_EQ(server_->counts().refused_full, 17);
  const std::string got = ReadToEof(scraper, milliseconds(20000));
  EXPECT_TRUE(StartsWith(got, "HTTP/1.1 200 OK\r\n")) << got.substr(0, 200);
  EXPECT_TRUE(eof_);
  EXPECT_EQ(got.size() - got.find("\r\n\r\n") - 4, body_.size());
}

TEST_F(MetricsServerTest, ListensOnEveryAddressGivenAtOnePort) {
  server_ = std::make_unique<MetricsServer>(
      io_, [this] { return std::make_shared<const std::string>(body_); });
  auto port =
      server_->Listen(std::vector<std::string>{"127.0.0.1", "127.0.0.3"}, 0);
  ASSERT_TRUE(port.ok()) << port.status().message();
  port_ = *port;
  for (uint32_t to : {0x7F000001u, 0x7F000003u}) {
    const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    fds_.push_back(fd);
    sockaddr_in sa{};
    sa.sin_family = AF_INET;
    sa.sin_port = htons(static_cast<uint16_t>(port_));
    sa.sin_addr.s_addr = htonl(to);
    ASSERT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&sa), sizeof(sa)), 0)
        << strerror(errno);
    Send(fd, "GET /metrics HTTP/1.1\r\n\r\n");
    EXPECT_TRUE(StartsWith(ReadToEof(fd), "HTTP/1.1 200 OK\r\n")) << to;
  }
  // Not on an address it was not given.
  const int other = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  fds_.push_back(other);
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_port = htons(static_cast<uint16_t>(port_));
  sa.sin_addr.s_addr = htonl(0x7F000002);
  EXPECT_NE(::connect(other, reinterpret_cast<sockaddr*>(&sa), sizeof(sa)), 0);
}

TEST_F(MetricsServerTest, BusyPortNamesAddressAndPort) {
  Start();
  MetricsServer other(io_, [] { return nullptr; });
  auto st = other.Listen("127.0.0.1", port_);
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.status().code(), StatusCode::kUnavailable);
  EXPECT_TRUE(Has(st.status().message(), "127.0.0.1:" + std::to_string(port_)))
      << st.status().message();
  auto bad = other.Listen("not-an-address", 0);
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument);
}

TEST_F(MetricsServerTest, StopClosesListenerAndConnections) {
  Start();
  const int fd = Connect();
  EXPECT_TRUE(RunUntil([&] { return server_->open_connections() == 1; }));
  server_->Stop();
  EXPECT_EQ(server_->open_connections(), 0u);
  EXPECT_EQ(ReadToEof(fd), "");
  EXPECT_TRUE(eof_);
  const int again = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  fds_.push_back(again);
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_port = htons(static_cast<uint16_t>(port_));
  sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  EXPECT_NE(::connect(again, reinterpret_cast<sockaddr*>(&sa), sizeof(sa)), 0);
  server_.reset();
  RunFor(milliseconds(20));  // handlers still queued find the server gone
}

}  // namespace
}  // namespace dslaunch::launcher
