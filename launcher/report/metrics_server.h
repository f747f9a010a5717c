// MetricsServer: the launcher's Prometheus endpoint (--metrics_port), a
// minimal HTTP/1.0-1.1 server: GET or HEAD /metrics (the text from `render`)
// and / (a page linking to it); one request per connection, then close.
// Owned by the Launcher; io_context thread only (it starts no thread).
//
// Hostile peers (nothing here authenticates): a request head is at most
// max_head_bytes (else 431 and close); the head must arrive within
// read_timeout of the accept (slowloris) and the response be taken within
// write_timeout (a client that never reads); at most max_connections are
// open: a new one beyond closes one still sending its request if there is
// any (a scraper being answered goes last, whatever a flood from many
// addresses does), of those the oldest of the peer address holding the most
// (a flood from one address cannot lock out a scraper from another; from
// the same address the newest survives the longest), counted as
// refused_full. Memory per
// connection is bounded by the head and a small header: every response to
// /metrics shares one rendered text.
#pragma once

#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "base/listen.h"
#include "base/status.h"

namespace dslaunch::launcher {

class MetricsServer {
 public:
  struct Options {
    size_t max_head_bytes = 8 * 1024;
    std::chrono::milliseconds read_timeout{5000};
    std::chrono::milliseconds write_timeout{10000};
    size_t max_connections = 32;
  };
  // What happened to connections since the start.
  struct Counts {
    int64_t accepted = 0;
    int64_t refused_full = 0;  // closed to make room: max_connections open
    int64_t timed_out = 0;     // read or write deadline passed
    int64_t bad_requests = 0;  // 400 or 431
    int64_t responses = 0;     // responses written in full
  };

  // One response: its head and its body (shared, null for none: HEAD).
  struct Reply {
    std::string head;
    std::shared_ptr<const std::string> body;
  };
  // The text of /metrics, shared by every response that is being written.
  using Render = std::function<std::shared_ptr<const std::string>()>;

  // `render` is called on the loop for each GET /metrics; it must be cheap.
  MetricsServer(boost::asio::io_context& io, Render render, Options options);
  MetricsServer(boost::asio::io_context& io, Render render)
      : MetricsServer(io, std::move(render), Options()) {}
  ~MetricsServer();  // Stop()
  MetricsServer(const MetricsServer&) = delete;
  MetricsServer& operator=(const MetricsServer&) = delete;

  // Binds every address of `addrs` (numeric IPv4 or IPv6) at `port` (0: a
  // free one, the same on all) and starts accepting; returns the bound port.
  // kInvalidArgument for a bad address, kUnavailable (naming address and
  // port) when one cannot be bound.
  StatusOr<int> Listen(const std::vector<std::string>& addrs, int port);
  StatusOr<int> Listen(const std::string& addr, int port) {
    return Listen(std::vector<std::string>{addr}, port);
  }
  // Closes the listening socket and every connection at once. Idempotent.
  void Stop();

  size_t open_connections() const { return connections_.size(); }
  const Counts& counts() const { return counts_; }

 private:
  struct Connection;
  using ConnectionPtr = std::shared_ptr<Connection>;

  void Accept(boost::asio::ip::tcp::acceptor& acceptor);
  void OnAccepted(boost::asio::ip::tcp::socket socket);
  void ReadHead(const ConnectionPtr& c);
  void OnRead(const ConnectionPtr& c, size_t n);
  void Respond(const ConnectionPtr& c, Reply reply);
  // The connection to close to make room for a new one.
  ConnectionPtr Evictee() const;
  void OnDeadline(const ConnectionPtr& c);
  void Close(const ConnectionPtr& c);
  // The response to a complete head.
  Reply Answer(const std::string& head);

  boost::asio::io_context& io_;
  Render render_;
  Options options_;
  base::Acceptors acceptors_;
  std::map<uint64_t, ConnectionPtr> connections_;  // by accept order
  uint64_t next_id_ = 0;
  Counts counts_;
  // Cleared on destruction: handlers still queued in the loop then leave the
  // server alone.
  std::shared_ptr<bool> alive_ = std::make_shared<bool>(true);
};

}  // namespace dslaunch::launcher
