#include "agent/horovod_rendezvous.h"

#include <spdlog/spdlog.h>
#include <unistd.h>  // geteuid

#include <boost/asio/read.hpp>
#include <boost/asio/read_until.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/streambuf.hpp>
#include <boost/asio/write.hpp>
#include <fstream>
#include <sstream>

#include "base/http_head.h"

namespace dslaunch::agent {

namespace asio = boost::asio;
using Tcp = asio::ip::tcp;

namespace {

// Scopes horovod's own hvd.init() meets in; their keys are cleared when
// every member said it finished (DELETE), as horovodrun's server does.
bool IsInitScope(std::string_view scope) {
  return scope == "global" || scope.starts_with("local_") ||
         scope.starts_with("cross_");
}

}  // namespace

// One client's one request: checked, read, answered from the store, closed.
class HorovodRendezvous::Connection
    : public std::enable_shared_from_this<Connection> {
 public:
  Connection(HorovodRendezvous& owner, Tcp::socket socket)
      : owner_(owner),
        alive_(owner.alive_),
        socket_(std::move(socket)),
        head_(kHorovodMaxHeadBytes),
        deadline_(socket_.get_executor()) {}

  void Start() {
    ++owner_.connections_;
    if (!PeerAllowed()) return Answer(403, "not the job's user");
    deadline_.expires_after(owner_.request_timeout_);
    deadline_.async_wait(
        [self = shared_from_this()](const boost::system::error_code& ec) {
          if (!ec) self->Shut();
        });
    asio::async_read_until(
        socket_, head_, "\r\n\r\n",
        [self = shared_from_this()](const boost::system::error_code& ec,
                                    size_t n) { self->OnHead(ec, n); });
  }

  void Shut() {
    boost::system::error_code ignored;
    deadline_.cancel();
    socket_.shutdown(Tcp::socket::shutdown_both, ignored);
    socket_.close(ignored);
  }

  ~Connection() {
    if (!*alive_) return;
    --owner_.connections_;
    owner_.Released();
  }

 private:
  bool PeerAllowed() {
    boost::system::error_code ec1, ec2;
    const auto peer = socket_.remote_endpoint(ec1);
    const auto local = socket_.local_endpoint(ec2);
    if (ec1 || ec2) return false;
    std::ifstream in("/proc/net/tcp");
    std::stringstream table;
    table << in.rdbuf();
    auto uid = LoopbackPeerUid(table.str(), local.port(), peer.port());
    if (uid.ok() && *uid == owner_.allowed_uid_) return true;
    if (owner_.refused_said_ < 3) {
      ++owner_.refused_said_;
      spdlog::warn("Horovod rendezvous: refused a connection from port {} ({})",
                   peer.port(),
                   uid.ok()
                       ? "uid " + std::to_string(*uid) + ", not the job's user"
                       : uid.status().message());
    }
    return false;
  }

  void OnHead(const boost::system::error_code& ec, size_t n) {
    if (!*alive_) return;
    if (ec == asio::error::not_found)
      return Answer(431, "a request head over " +
                             std::to_string(kHorovodMaxHeadBytes) + " bytes");
    if (ec) return Shut();
    const auto data = head_.data();
    std::string bytes(asio::buffers_begin(data), asio::buffers_end(data));
    request_ = ParseHorovodRequestHead(std::string_view(bytes).substr(0, n));
    if (request_.status != 200) return Answer(request_.status, request_.why);
    // What came after the head is the body's start (one request only).
    body_ = bytes.substr(n, request_.content_length);
    const size_t have = body_.size();
    if (have == request_.content_length) return Serve();
    body_.resize(request_.content_length);
    asio::async_read(socket_,
                     asio::buffer(body_.data() + have, body_.size() - have),
                     [self = shared_from_this()](
                         const boost::system::error_code& ec, size_t) {
                       if (!*self->alive_) return;
                       if (ec) return self->Shut();
                       self->Serve();
                     });
  }

  void Serve() {
    const std::string key =
        std::string(kHorovodKeyPrefix) + request_.scope + "/" + request_.key;
    wire::StoreRequest r;
    r.add_keys(key);
    if (request_.method == "PUT") {
      r.set_op(wire::StoreRequest::SET);
      r.set_value(std::move(body_));
      return Ask(std::move(r), [](Connection& c, const wire::StoreResponse& a) {
        c.AnswerStore(a, "");
      });
    }
    if (request_.method == "DELETE") return Delete(key);
    // GET: 404 while the key is missing (the worker polls), else its value.
    r.set_op(wire::StoreRequest::CHECK);
    Ask(std::move(r), [key](Connection& c, const wire::StoreResponse& a) {
      if (!a.ok()) return c.AnswerStore(a, "");
      if (!a.ready()) return c.Answer(404, "");
      wire::StoreRequest get;
      get.set_op(wire::StoreRequest::GET);
      get.add_keys(key);
      get.set_timeout_ms(2000);  // it was there; gone meanwhile reads as 404
      c.Ask(std::move(get), [](Connection& c, const wire::StoreResponse& v) {
        if (!v.ok() && v.code() == wire::StoreResponse::TIMEOUT)
          return c.Answer(404, "");
        c.AnswerStore(v, v.value());
      });
    });
  }

  // A worker finished a scope's rendezvous. An ad-hoc scope's key goes at
  // once; hvd.init()'s scopes are counted, and the last member's DELETE
  // clears every member's key, so that a later hvd.init() meets afresh.
  void Delete(const std::string& key) {
    const int size = owner_.ScopeSize(request_.scope);
    wire::StoreRequest r;
    if (!IsInitScope(request_.scope) || size <= 0) {
      r.set_op(wire::StoreRequest::DELETE);
      r.add_keys(key);
      return Ask(std::move(r), [](Connection& c, const wire::StoreResponse& a) {
        c.AnswerStore(a, "");
      });
    }
    const std::string counter =
        std::string(kHorovodKeyPrefix) + "finished/" + request_.scope;
    r.set_op(wire::StoreRequest::ADD);
    r.add_keys(counter);
    r.set_delta(1);
    Ask(std::move(r),
        [size, counter](Connection& c, const wire::StoreResponse& a) {
          if (!a.ok() || a.value() != std::to_string(size))
            return c.AnswerStore(a, "");
          // The last one: every member's keys (Gloo's "<rank>" for its
          // addresses and "rank_<rank>" for its host), then the counter.
          const std::string scope =
              std::string(kHorovodKeyPrefix) + c.request_.scope + "/";
          std::vector<std::string> keys;
          for (int i = 0; i < size; ++i) {
            keys.push_back(scope + std::to_string(i));
            keys.push_back(scope + "rank_" + std::to_string(i));
          }
          keys.push_back(counter);
          for (const auto& k : keys) {
            wire::StoreRequest del;
            del.set_op(wire::StoreRequest::DELETE);
            del.add_keys(k);
            c.owner_.submit_(std::move(del), [](const wire::StoreResponse&) {});
          }
          c.Answer(200, "");
        });
  }

  using Then = std::function<void(Connection&, const wire::StoreResponse&)>;
  void Ask(wire::StoreRequest r, Then then) {
    owner_.submit_(std::move(r),
                   [self = shared_from_this(),
                    then = std::move(then)](const wire::StoreResponse& a) {
                     if (*self->alive_ && self->socket_.is_open())
                       then(*self, a);
                   });
  }

  void AnswerStore(const wire::StoreResponse& a, const std::string& body) {
    if (a.ok()) return Answer(200, body);
    Answer(a.code() == wire::StoreResponse::CLOSED ? 503 : 500, a.error());
  }

  void Answer(int status, const std::string& body) {
    response_ = base::HttpResponseHead(status, body.size()) + body;
    asio::async_write(
        socket_, asio::buffer(response_),
        [self = shared_from_this()](const boost::system::error_code&, size_t) {
          self->Shut();
        });
  }

  HorovodRendezvous& owner_;
  std::shared_ptr<bool> alive_;
  Tcp::socket socket_;
  asio::streambuf head_;
  asio::steady_timer deadline_;
  HttpRequest request_;
  std::string body_;
  std::string response_;
};

HorovodRendezvous::HorovodRendezvous(asio::io_context& io, Submit submit)
    : io_(io),
      submit_(std::move(submit)),
      acceptor_(io),
      allowed_uid_(::geteuid()) {}

HorovodRendezvous::~HorovodRendezvous() {
  Close();
  *alive_ = false;
}

Status HorovodRendezvous::Listen() {
  boost::system::error_code ec;
  const Tcp::endpoint at(asio::ip::address_v4::loopback(), 0);
  acceptor_.open(at.protocol(), ec);
  if (!ec) acceptor_.bind(at, ec);
  if (!ec) acceptor_.listen(asio::socket_base::max_listen_connections, ec);
  if (ec) return Internal("Horovod rendezvous on 127.0.0.1: " + ec.message());
  port_ = acceptor_.local_endpoint().port();
  Accept();
  return Status::Ok();
}

void HorovodRendezvous::SetScopes(std::map<std::string, int> sizes) {
  scope_sizes_ = std::move(sizes);
}

int HorovodRendezvous::ScopeSize(const std::string& scope) const {
  auto it = scope_sizes_.find(scope);
  return it == scope_sizes_.end() ? 0 : it->second;
}

void HorovodRendezvous::Accept() {
  if (paused_ || accepting_ || !acceptor_.is_open() ||
      connections_ >= kHorovodMaxConnections)
    return;
  accepting_ = true;
  acceptor_.async_accept(
      [this, alive = alive_](boost::system::error_code ec, Tcp::socket socket) {
        if (!*alive) return;
        accepting_ = false;
        if (ec == asio::error::operation_aborted || !acceptor_.is_open())
          return;
        if (!ec) {
          auto c = std::make_shared<Connection>(*this, std::move(socket));
          open_.push_back(c);
          c->Start();
        }
        std::erase_if(open_, [](const auto& w) { return w.expired(); });
        Accept();
      });
}

void HorovodRendezvous::Released() {
  // A slot freed: accept again if the limit had stopped it.
  asio::post(io_, [this, alive = alive_] {
    if (*alive) Accept();
  });
}

void HorovodRendezvous::PauseAccepting() { paused_ = true; }

void HorovodRendezvous::ResumeAccepting() {
  if (!paused_) return;
  paused_ = false;
  Accept();
}

void HorovodRendezvous::Close() {
  boost::system::error_code ignored;
  if (acceptor_.is_open()) acceptor_.close(ignored);
  auto open = std::move(open_);
  open_.clear();
  for (auto& w : open) {
    if (auto c = w.lock()) c->Shut();
  }
}

}  // namespace dslaunch::agent
