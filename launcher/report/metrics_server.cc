#include "launcher/report/metrics_server.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <array>
#include <boost/asio/ip/v6_only.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/write.hpp>
#include <string_view>
#include <vector>

#include "base/http_head.h"

namespace dslaunch::launcher {

namespace asio = boost::asio;
using asio::ip::tcp;

struct MetricsServer::Connection {
  Connection(asio::io_context& io, tcp::socket s, uint64_t id)
      : id(id), socket(std::move(s)), timer(io) {}
  uint64_t id;
  tcp::socket socket;
  asio::steady_timer timer;  // the read deadline, then the write deadline
  std::array<char, 1024> chunk;
  std::string peer;  // the address it came from
  std::string head;  // what came so far, at most max_head_bytes + chunk
  MetricsServer::Reply reply;  // held until written
  bool answering = false;      // a whole request came: writing its answer
  bool closed = false;
};

namespace {

constexpr std::string_view kContentType =
    "text/plain; version=0.0.4; charset=utf-8";
constexpr std::string_view kIndexPage =
    "<html><head><title>dslaunch</title></head><body>"
    "<h1>dslaunch</h1><p><a href=\"/metrics\">Metrics</a></p>"
    "</body></html>\n";

MetricsServer::Reply HttpResponse(int code, std::string_view content_type,
                                  std::shared_ptr<const std::string> body,
                                  bool head_only, std::string_view extra = "") {
  std::string fields = "Content-Type: " + std::string(content_type) + "\r\n";
  fields.append(extra);
  std::string r = base::HttpResponseHead(code, body->size(), fields);
  if (head_only) body = nullptr;
  return {std::move(r), std::move(body)};
}

MetricsServer::Reply PlainError(int code, bool head_only,
                                std::string_view extra = "") {
  return HttpResponse(code, "text/plain; charset=utf-8",
                      std::make_shared<const std::string>(
                          std::string(base::HttpReason(code)) + "\n"),
                      head_only, extra);
}

// Where the head ends (just after the blank line), searching from `from`.
size_t HeadEnd(const std::string& head, size_t from) {
  for (size_t i = from; i < head.size(); ++i) {
    if (head[i] != '\n') continue;
    if (i >= 1 && head[i - 1] == '\n') return i + 1;
    if (i >= 2 && head[i - 1] == '\r' && head[i - 2] == '\n') return i + 1;
  }
  return std::string::npos;
}

}  // namespace

MetricsServer::MetricsServer(asio::io_context& io, Render render,
                             Options options)
    : io_(io), render_(std::move(render)), options_(options) {}

MetricsServer::~MetricsServer() {
  Stop();
  *alive_ = false;
}

StatusOr<int> MetricsServer::Listen(const std::vector<std::string>& addrs,
                                    int port) {
  if (!acceptors_.empty())
    return Internal("the metrics server is already listening");
  if (addrs.empty()) return InvalidArgument("--metrics_addr: no address");
  if (port < 0 || port > 65535) {
    return InvalidArgument("--metrics_port: bad port " + std::to_string(port));
  }
  StatusOr<int> bound = base::ListenAll(io_, addrs, port, &acceptors_);
  if (!bound.ok()) {
    const Status& st = bound.status();
    return Status(st.code(), (st.code() == StatusCode::kInvalidArgument
                                  ? "--metrics_addr: "
                                  : "metrics endpoint: ") +
                                 st.message());
  }
  for (auto& acceptor : acceptors_) Accept(*acceptor);
  return bound;
}

void MetricsServer::Stop() {
  boost::system::error_code ignored;
  for (auto& acceptor : acceptors_) acceptor->close(ignored);
  for (auto& [id, c] : connections_) {
    c->closed = true;
    c->timer.cancel();
    c->socket.close(ignored);
  }
  connections_.clear();
}

void MetricsServer::Accept(tcp::acceptor& acceptor) {
  acceptor.async_accept([this, &acceptor, alive = alive_](
                            boost::system::error_code ec, tcp::socket socket) {
    if (!*alive || !acceptor.is_open()) return;
    if (!ec) {
      OnAccepted(std::move(socket));
      return Accept(acceptor);
    }
    if (ec == asio::error::operation_aborted) return;
    // Out of descriptors or memory: do not spin; try again shortly.
    spdlog::debug("metrics endpoint: accept failed: {}", ec.message());
    auto retry = std::make_shared<asio::steady_timer>(
        io_, std::chrono::milliseconds(50));
    retry->async_wait(
        [this, &acceptor, retry, alive](const boost::system::error_code&) {
          if (*alive && acceptor.is_open()) Accept(acceptor);
        });
  });
}

MetricsServer::ConnectionPtr MetricsServer::Evictee() const {
  // A connection being answered sent a whole request: a scraper. Those
  // still sending theirs go first; of them, the oldest of the address
  // holding the most (of equals, the one whose oldest is older).
  bool any_reading = false;
  for (const auto& [id, c] : connections_) any_reading |= !c->answering;
  std::map<std::string, std::pair<size_t, ConnectionPtr>> by_peer;
  for (const auto& [id, c] : connections_) {  // oldest first
    if (any_reading && c->answering) continue;
    auto& [count, oldest] = by_peer[c->peer];
    if (count++ == 0) oldest = c;
  }
  const std::pair<size_t, ConnectionPtr>* pick = nullptr;
  for (const auto& [peer, entry] : by_peer) {
    if (!pick || entry.first > pick->first ||
        (entry.first == pick->first && entry.second->id < pick->second->id))
      pick = &entry;
  }
  return pick ? pick->second : nullptr;
}

void MetricsServer::OnAccepted(tcp::socket socket) {
  ++counts_.accepted;
  boost::system::error_code ec;
  const tcp::endpoint remote = socket.remote_endpoint(ec);
  if (ec) return;  // already reset by the peer
  if (connections_.size() >= options_.max_connections) {
    ++counts_.refused_full;
    if (ConnectionPtr evictee = Evictee()) Close(evictee);
  }
  auto c = std::make_shared<Connection>(io_, std::move(socket), next_id_++);
  c->peer = remote.address().to_string();
  connections_[c->id] = c;
  c->timer.expires_after(options_.read_timeout);
  c->timer.async_wait(
      [this, c, alive = alive_](const boost::system::error_code& ec) {
        if (*alive && !ec) OnDeadline(c);
      });
  ReadHead(c);
}

void MetricsServer::ReadHead(const ConnectionPtr& c) {
  c->socket.async_read_some(
      asio::buffer(c->chunk),
      [this, c, alive = alive_](const boost::system::error_code& ec, size_t n) {
        if (!*alive || c->closed) return;
        if (ec) return Close(c);  // EOF or reset before a whole head
        OnRead(c, n);
      });
}

void MetricsServer::OnRead(const ConnectionPtr& c, size_t n) {
  const size_t old_size = c->head.size();
  c->head.append(c->chunk.data(), n);
  const size_t end = HeadEnd(c->head, old_size > 2 ? old_size - 2 : 0);
  if (end == std::string::npos || end > options_.max_head_bytes) {
    if (c->head.size() <= options_.max_head_bytes) return ReadHead(c);
    ++counts_.bad_requests;
    return Respond(c, PlainError(431, false));
  }
  c->head.resize(end);
  Respond(c, Answer(c->head));
}

MetricsServer::Reply MetricsServer::Answer(const std::string& head) {
  const auto request = base::ParseHttpRequestHead(head);
  if (!request) {
    ++counts_.bad_requests;
    return PlainError(400, false);
  }
  const std::string_view method = request->method;
  // The target without its query.
  const std::string_view path =
      request->target.substr(0, request->target.find('?'));
  const bool head_only = method == "HEAD";
  if (method != "GET" && !head_only) {
    return PlainError(405, false, "Allow: GET, HEAD\r\n");
  }
  if (path == "/metrics") {
    auto text = render_();
    if (!text) text = std::make_shared<const std::string>();
    return HttpResponse(200, kContentType, std::move(text), head_only);
  }
  if (path == "/") {
    return HttpResponse(200, "text/html; charset=utf-8",
                        std::make_shared<const std::string>(kIndexPage),
                        head_only);
  }
  return PlainError(404, head_only);
}

void MetricsServer::Respond(const ConnectionPtr& c, Reply reply) {
  c->head.clear();
  c->head.shrink_to_fit();
  c->reply = std::move(reply);
  c->answering = true;
  c->timer.expires_after(options_.write_timeout);  // cancels the read's wait
  c->timer.async_wait(
      [this, c, alive = alive_](const boost::system::error_code& ec) {
        if (*alive && !ec) OnDeadline(c);
      });
  std::array<asio::const_buffer, 2> buffers = {
      asio::buffer(c->reply.head),
      c->reply.body ? asio::buffer(*c->reply.body) : asio::const_buffer()};
  asio::async_write(
      c->socket, buffers,
      [this, c, alive = alive_](const boost::system::error_code& ec, size_t) {
        if (!*alive || c->closed) return;
        if (!ec) {
          ++counts_.responses;
          boost::system::error_code ignored;
          c->socket.shutdown(tcp::socket::shutdown_send, ignored);
        }
        Close(c);
      });
}

void MetricsServer::OnDeadline(const ConnectionPtr& c) {
  if (c->closed) return;
  ++counts_.timed_out;
  spdlog::debug("metrics endpoint: a connection passed its deadline");
  Close(c);
}

void MetricsServer::Close(const ConnectionPtr& c) {
  if (c->closed) return;
  c->closed = true;
  boost::system::error_code ignored;
  c->timer.cancel();
  c->socket.close(ignored);
  connections_.erase(c->id);
}

}  // namespace dslaunch::launcher
