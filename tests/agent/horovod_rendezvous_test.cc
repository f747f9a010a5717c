#include "agent/horovod_rendezvous.h"

#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <boost/asio/io_context.hpp>
#include <boost/asio/post.hpp>
#include <chrono>
#include <map>
#include <string>
#include <thread>

#include "tests/common/run_until.h"

namespace dslaunch::agent {
namespace {

namespace asio = boost::asio;
using dslaunch::testing::RunUntil;

// The request line and headers, as ParseHorovodRequestHead takes them.
HttpRequest Head(const std::string& text) {
  return ParseHorovodRequestHead(text);
}

TEST(HorovodHttpTest, ParsesWhatHorovodSends) {
  // Horovod's HTTPRequest client: request line, headers, Host, length.
  HttpRequest r = Head(
      "PUT /global/rank_0 HTTP/1.1\r\nHost: 127.0.0.1\r\n"
      "Content-Length: 5\r\n\r\n");
  EXPECT_EQ(r.status, 200) << r.why;
  EXPECT_EQ(r.method, "PUT");
  EXPECT_EQ(r.scope, "global");
  EXPECT_EQ(r.key, "rank_0");
  EXPECT_EQ(r.content_length, 5u);
  r = Head("GET /local_h1/3 HTTP/1.1\r\ncontent-length:  0 \r\n\r\n");
  EXPECT_EQ(r.status, 200) << r.why;
  EXPECT_EQ(r.scope, "local_h1");
  EXPECT_EQ(r.key, "3");
  r = Head("DELETE /cross_0/1 HTTP/1.0\r\n\r\n");
  EXPECT_EQ(r.status, 200) << r.why;
  EXPECT_EQ(r.content_length, 0u);
}

TEST(HorovodHttpTest, RefusesWhatItDoesNotServe) {
  EXPECT_EQ(Head("POST /a/b HTTP/1.1\r\n\r\n").status, 405);
  EXPECT_EQ(Head("GET /a HTTP/1.1\r\n\r\n").status, 400);
  EXPECT_EQ(Head("GET /a/b/c HTTP/1.1\r\n\r\n").status, 400);
  EXPECT_EQ(Head("GET //b HTTP/1.1\r\n\r\n").status, 400);
  EXPECT_EQ(Head("GET /a/ HTTP/1.1\r\n\r\n").status, 400);
  EXPECT_EQ(Head("GET a/b HTTP/1.1\r\n\r\n").status, 400);
  EXPECT_EQ(Head("GET /a/b\x01 HTTP/1.1\r\n\r\n").status, 400);
  EXPECT_EQ(Head("GET /a/b HTTP/2\r\n\r\n").status, 400);
  EXPECT_EQ(Head("GET /a/b  HTTP/1.1\r\n\r\n").status, 400);
  EXPECT_EQ(Head("GET /a/b HTTP/1.1\r\nno colon\r\n\r\n").status, 400);
  EXPECT_EQ(Head("GET /a/b HTTP/1.1\r\nContent-Length: -1\r\n\r\n").status,
            400);
  EXPECT_EQ(Head("GET /a/b HTTP/1.1\r\nContent-Length: 1x\r\n\r\n").status,
            400);
  EXPECT_EQ(Head("PUT /a/b HTTP/1.1\r\nContent-Length: 1\r\n"
                 "Content-Length: 2\r\n\r\n")
                .status,
            400);
  EXPECT_EQ(Head("PUT /a/b HTTP/1.1\r\n\r\n").status, 411);
  EXPECT_EQ(
      Head("PUT /a/b HTTP/1.1\r\nContent-Length: 99999999999\r\n\r\n").status,
      413);
  EXPECT_EQ(Head("PUT /a/b HTTP/1.1\r\nContent-Length: 99999999999999999999"
                 "999\r\n\r\n")
                .status,
            400);
  EXPECT_EQ(
      Head("PUT /a/b HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n").status,
      501);
  EXPECT_EQ(Head("").status, 400);
}

TEST(HorovodHttpTest, FindsTheOwnerOfALoopbackConnection) {
  // Two connections between the same ports, both directions listed, as
  // /proc/net/tcp shows them on a little- or big-endian machine alike (the
  // address is the kernel's network-order word printed as a number).
  char lo[9];
  std::snprintf(lo, sizeof lo, "%08X", htonl(INADDR_LOOPBACK));
  const std::string l(lo);
  const std::string table =
      "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when "
      "retrnsmt   uid  timeout inode\n"
      "   0: " +
      l +
      ":1F90 00000000:0000 0A 00000000:00000000 00:00000000 "
      "00000000     0        0 1 1 0 100 0 0 10 0\n"
      "   1: " +
      l + ":C350 " + l +
      ":1F90 01 00000000:00000000 00:00000000 "
      "00000000  1000        0 2 1 0 20 4 30 10 -1\n"
      "   2: " +
      l + ":1F90 " + l +
      ":C350 01 00000000:00000000 00:00000000 "
      "00000000     0        0 3 1 0 20 4 30 10 -1\n"
      "   3: 0A000001:C351 " +
      l +
      ":1F90 01 00000000:00000000 00:00000000 "
      "00000000    7        0 4 1 0 20 4 30 10 -1\n";
  auto uid = LoopbackPeerUid(table, 0x1F90, 0xC350);
  ASSERT_TRUE(uid.ok()) << uid.status().ToString();
  EXPECT_EQ(*uid, 1000u);
  // The server's own side is never taken for the peer.
  auto server = LoopbackPeerUid(table, 0xC350, 0x1F90);
  ASSERT_TRUE(server.ok());
  EXPECT_EQ(*server, 0u);
  // Not from loopback, not listed, garbage: not found.
  EXPECT_FALSE(LoopbackPeerUid(table, 0x1F90, 0xC351).ok());
  EXPECT_FALSE(LoopbackPeerUid(table, 0x1F90, 0x1234).ok());
  EXPECT_FALSE(LoopbackPeerUid("garbage\n1 2 3\n", 1, 2).ok());
  EXPECT_FALSE(LoopbackPeerUid("", 1, 2).ok());
}

// The rendezvous over a store kept in a map, answering later as the
// launcher does.
class HorovodRendezvousTest : public ::testing::Test {
 protected:
  HorovodRendezvousTest()
      : rendezvous_(io_, [this](wire::StoreRequest r, StoreProxy::Answer a) {
          asio::post(
              io_, [this, r = std::move(r), a = std::move(a)] { a(Serve(r)); });
        }) {
    EXPECT_TRUE(rendezvous_.Listen().ok());
  }

  wire::StoreResponse Serve(const wire::StoreRequest& r) {
    ++requests_;
    wire::StoreResponse a;
    a.set_id(r.id());
    a.set_ok(true);
    const std::string& key = r.keys(0);
    switch (r.op()) {
      case wire::StoreRequest::SET:
        store_[key] = r.value();
        break;
      case wire::StoreRequest::CHECK:
        a.set_ready(store_.count(key) > 0);
        break;
      case wire::StoreRequest::GET:
        if (store_.count(key)) {
          a.set_value(store_[key]);
        } else {
          a.set_ok(false);
          a.set_code(wire::StoreResponse::TIMEOUT);
        }
        break;
      case wire::StoreRequest::DELETE:
        store_.erase(key);
        break;
      case wire::StoreRequest::ADD: {
        const int64_t v =
            (store_.count(key) ? std::stoll(store_[key]) : 0) + r.delta();
        store_[key] = std::to_string(v);
        a.set_value(store_[key]);
        break;
      }
      default:
        a.set_ok(false);
        a.set_error("unexpected op");
    }
    return a;
  }

  // Sends `request` over a fresh connection from a thread and runs the loop
  // until the server closes it; returns what came back.
  std::string Exchange(const std::string& request) {
    std::string reply;
    bool done = false;
    std::thread client([&] {
      reply = SendAndRead(rendezvous_.port(), request);
      done = true;
    });
    RunUntil(
        io_, [&] { return done; }, std::chrono::seconds(10));
    client.join();
    return reply;
  }

  static std::string SendAndRead(uint16_t port, const std::string& request) {
    int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in to{};
    to.sin_family = AF_INET;
    to.sin_port = htons(port);
    to.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (::connect(fd, reinterpret_cast<sockaddr*>(&to), sizeof to) != 0) {
      ::close(fd);
      return "connect failed";
    }
    (void)!::send(fd, request.data(), request.size(), MSG_NOSIGNAL);
    std::string reply;
    char buf[4096];
    ssize_t n;
    while ((n = ::recv(fd, buf, sizeof buf, 0)) > 0) reply.append(buf, n);
    ::close(fd);
    return reply;
  }

  static std::string Put(const std::string& path, const std::string& body) {
    return "PUT " + path + " HTTP/1.1\r\nHost: x\r\nContent-Length: " +
           std::to_string(body.size()) + "\r\n\r\n" + body;
  }
  static std::string Get(const std::string& path) {
    return "GET " + path + " HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n";
  }
  static std::string Delete(const std::string& path) {
    return "DELETE " + path +
           " HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n";
  }
  static std::string Reply(int status, const std::string& reason,
                           const std::string& body) {
    return "HTTP/1.1 " + std::to_string(status) + " " + reason +
           "\r\nContent-Length: " + std::to_string(body.size()) +
           "\r\nConnection: close\r\n\r\n" + body;
  }

  asio::io_context io_;
  std::map<std::string, std::string> store_;
  int requests_ = 0;
  HorovodRendezvous rendezvous_;
};

TEST_F(HorovodRendezvousTest, SetsAndGetsThroughTheStore) {
  EXPECT_EQ(Exchange(Get("/global/0")), Reply(404, "Not Found", ""));
  const std::string value("addr\0\xff bytes", 12);
  EXPECT_EQ(Exchange(Put("/global/0", value)), Reply(200, "OK", ""));
  EXPECT_EQ(store_["horovod/global/0"], value);
  EXPECT_EQ(Exchange(Get("/global/0")), Reply(200, "OK", value));
  // The body may come in pieces after the head.
  EXPECT_EQ(Exchange(Put("/global/rank_1", std::string(40000, 'v'))),
            Reply(200, "OK", ""));
  EXPECT_EQ(store_["horovod/global/rank_1"].size(), 40000u);
}

TEST_F(HorovodRendezvousTest, RefusesBadRequestsWithoutTouchingTheStore) {
  EXPECT_EQ(Exchange("POST /a/b HTTP/1.1\r\n\r\n").substr(0, 12),
            "HTTP/1.1 405");
  EXPECT_EQ(Exchange(Get("/a/b/c")).substr(0, 12), "HTTP/1.1 400");
  EXPECT_EQ(Exchange("PUT /a/b HTTP/1.1\r\nContent-Length: 70000\r\n\r\n")
                .substr(0, 12),
            "HTTP/1.1 413");
  // A head that never ends within the limit.
  EXPECT_EQ(Exchange("GET /a/b HTTP/1.1\r\nX: " + std::string(9000, 'x'))
                .substr(0, 12),
            "HTTP/1.1 431");
  EXPECT_EQ(requests_, 0);
}

TEST_F(HorovodRendezvousTest, ClosesOnAClientThatDoesNotFinish) {
  rendezvous_.set_request_timeout(std::chrono::milliseconds(200));
  const auto t0 = std::chrono::steady_clock::now();
  // Half a head, then nothing: the connection is closed without an answer.
  EXPECT_EQ(Exchange("GET /global/0 HTTP/1.1\r\nHo"), "");
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(5));
  // A body shorter than its Content-Length: the same.
  EXPECT_EQ(Exchange("PUT /global/0 HTTP/1.1\r\nContent-Length: 10\r\n\r\nab"),
            "");
  EXPECT_EQ(requests_, 0);
  EXPECT_TRUE(RunUntil(io_, [&] { return rendezvous_.connections() == 0; }));
}

TEST_F(HorovodRendezvousTest, ClearsAnInitScopeWhenItsLastMemberFinishes) {
  rendezvous_.SetScopes({{"global", 2}, {"local_h1", 2}});
  for (const char* k : {"0", "1", "rank_0", "rank_1"})
    ASSERT_EQ(Exchange(Put(std::string("/global/") + k, "a")),
              Reply(200, "OK", ""));
  EXPECT_EQ(Exchange(Delete("/global/0")), Reply(200, "OK", ""));
  EXPECT_EQ(store_.count("horovod/global/0"), 1u);  // one of two finished
  EXPECT_EQ(Exchange(Delete("/global/1")), Reply(200, "OK", ""));
  RunUntil(
      io_, [&] { return store_.empty(); }, std::chrono::seconds(1));
  EXPECT_TRUE(store_.empty()) << store_.begin()->first;
  // The next hvd.init() counts afresh.
  ASSERT_EQ(Exchange(Put("/global/0", "b")), Reply(200, "OK", ""));
  EXPECT_EQ(Exchange(Delete("/global/0")), Reply(200, "OK", ""));
  EXPECT_EQ(store_["horovod/global/0"], "b");
  EXPECT_EQ(store_["horovod/finished/global"], "1");
}

TEST_F(HorovodRendezvousTest, DeletesAnAdHocScopesKeyAtOnce) {
  ASSERT_EQ(Exchange(Put("/global_process_set_1/0", "a")),
            Reply(200, "OK", ""));
  ASSERT_EQ(Exchange(Put("/global_process_set_1/1", "a")),
            Reply(200, "OK", ""));
  EXPECT_EQ(Exchange(Delete("/global_process_set_1/0")), Reply(200, "OK", ""));
  EXPECT_EQ(store_.count("horovod/global_process_set_1/0"), 0u);
  EXPECT_EQ(store_.count("horovod/global_process_set_1/1"), 1u);
}

TEST_F(HorovodRendezvousTest, ServesOnlyItsOwnUser) {
  rendezvous_.set_allowed_uid(::geteuid() + 1);
  EXPECT_EQ(Exchange(Put("/global/0", "a")).substr(0, 12), "HTTP/1.1 403");
  EXPECT_EQ(requests_, 0);
  rendezvous_.set_allowed_uid(::geteuid());
  EXPECT_EQ(Exchange(Put("/global/0", "a")), Reply(200, "OK", ""));
}

TEST_F(HorovodRendezvousTest, RefusesAnotherUsersProcess) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root to become another user";
  // A child that becomes nobody and asks; the server, run by root, refuses.
  int pipefd[2];
  ASSERT_EQ(::pipe(pipefd), 0);
  const uint16_t port = rendezvous_.port();
  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    ::close(pipefd[0]);
    if (::setgid(65534) != 0 || ::setuid(65534) != 0) ::_exit(2);
    const std::string reply = SendAndRead(port, Put("/global/0", "a"));
    (void)!::write(pipefd[1], reply.data(), reply.size());
    ::_exit(0);
  }
  ::close(pipefd[1]);
  int status = 0;
  RunUntil(
      io_, [&] { return ::waitpid(pid, &status, WNOHANG) == pid; },
      std::chrono::seconds(10));
  char buf[256] = {0};
  const ssize_t n = ::read(pipefd[0], buf, sizeof buf - 1);
  ::close(pipefd[0]);
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  EXPECT_EQ(std::string(buf, n > 0 ? n : 0).substr(0, 12), "HTTP/1.1 403");
  EXPECT_EQ(requests_, 0);
}

TEST_F(HorovodRendezvousTest, TakesNoConnectionWhilePaused) {
  rendezvous_.PauseAccepting();
  // The one accept already waiting may take a connection; the next waits.
  EXPECT_EQ(Exchange(Put("/global/0", "a")), Reply(200, "OK", ""));
  std::string reply;
  bool done = false;
  std::thread client([&] {
    reply = SendAndRead(rendezvous_.port(), Put("/global/1", "b"));
    done = true;
  });
  RunUntil(
      io_, [&] { return done; }, std::chrono::milliseconds(300));
  EXPECT_FALSE(done);
  EXPECT_EQ(store_.count("horovod/global/1"), 0u);
  rendezvous_.ResumeAccepting();
  RunUntil(
      io_, [&] { return done; }, std::chrono::seconds(10));
  client.join();
  EXPECT_EQ(reply, Reply(200, "OK", ""));
  EXPECT_EQ(store_["horovod/global/1"], "b");
}

TEST_F(HorovodRendezvousTest, AnswersUnavailableWhenTheStoreIsClosed) {
  HorovodRendezvous closed(io_, [](wire::StoreRequest r, StoreProxy::Answer a) {
    wire::StoreResponse s;
    s.set_id(r.id());
    s.set_ok(false);
    s.set_code(wire::StoreResponse::CLOSED);
    s.set_error("store unreachable: job ended");
    a(s);
  });
  ASSERT_TRUE(closed.Listen().ok());
  std::string reply;
  bool done = false;
  std::thread client([&] {
    reply = SendAndRead(closed.port(), Get("/global/0"));
    done = true;
  });
  RunUntil(
      io_, [&] { return done; }, std::chrono::seconds(10));
  client.join();
  EXPECT_EQ(reply,
            Reply(503, "Service Unavailable", "store unreachable: job ended"));
}

TEST_F(HorovodRendezvousTest, CloseEndsOpenConnections) {
  rendezvous_.set_request_timeout(std::chrono::seconds(30));
  std::string reply = "unset";
  bool done = false;
  std::thread client([&] {
    reply = SendAndRead(rendezvous_.port(), "GET /global/0 HTTP/1.1\r\n");
    done = true;
  });
  RunUntil(io_, [&] { return rendezvous_.connections() == 1; });
  rendezvous_.Close();
  RunUntil(
      io_, [&] { return done; }, std::chrono::seconds(5));
  client.join();
  EXPECT_EQ(reply, "");
}

}  // namespace
}  // namespace dslaunch::agent
