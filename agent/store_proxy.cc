#include "agent/store_proxy.h"

#include <sys/stat.h>  // chmod
#include <unistd.h>    // unlink

namespace dslaunch::agent {

namespace asio = boost::asio;
using Local = asio::local::stream_protocol;

StoreProxy::StoreProxy(asio::io_context& io, Forward forward)
    : io_(io), forward_(std::move(forward)), acceptor_(io) {}

StoreProxy::~StoreProxy() {
  Close();
  *alive_ = false;
}

Status StoreProxy::Listen(const std::string& path) {
  path_ = path;
  ::unlink(path.c_str());
  boost::system::error_code ec;
  acceptor_.open(Local(), ec);
  if (!ec) acceptor_.bind(Local::endpoint(path), ec);
  if (!ec) acceptor_.listen(asio::socket_base::max_listen_connections, ec);
  if (ec) return Internal("store socket " + path + ": " + ec.message());
  ::chmod(path.c_str(), 0600);
  Accept();
  return Status::Ok();
}

void StoreProxy::Accept() {
  auto socket = std::make_shared<Local::socket>(io_);
  acceptor_.async_accept(
      *socket, [this, socket, alive = alive_](boost::system::error_code ec) {
        if (!*alive || ec) return;
        proto::Channel::Limits limits;
        limits.soft_queue_bytes = 1u << 20;
        limits.hard_queue_bytes = 64u << 20;
        auto client = proto::Channel::Create(
            proto::Channel::Socket(std::move(*socket)), "store client", limits);
        clients_.insert(client);
        if (paused_) client->PauseReading();
        std::weak_ptr<proto::Channel> weak = client;
        client->Start({
            .on_message =
                [this, weak](wire::Envelope&& msg) {
                  auto c = weak.lock();
                  if (!c) return;
                  if (!msg.has_store_request()) {
                    return c->Close(ProtocolError("expected a store request"));
                  }
                  HandleRequest(c, std::move(*msg.mutable_store_request()));
                },
            .on_close =
                [this, weak, alive = alive_](const Status&) {
                  if (!*alive) return;
                  if (auto c = weak.lock()) clients_.erase(c);
                },
            .on_drain =
                [this, weak] {
                  auto c = weak.lock();
                  if (c && !paused_) c->ResumeReading();
                },
        });
        Accept();
      });
}

void StoreProxy::Submit(wire::StoreRequest request, Answer answer) {
  const uint64_t client_id = request.id();
  const uint64_t id = next_id_++;
  request.set_id(id);
  pending_.emplace(id, std::move(answer));
  Status st = forward_(request);
  if (st.ok()) return;
  auto it = pending_.find(id);
  Answer failed = std::move(it->second);
  pending_.erase(it);
  wire::StoreResponse r;
  r.set_id(client_id);
  r.set_ok(false);
  r.set_error("store unreachable: " + st.message());
  r.set_code(wire::StoreResponse::CLOSED);
  failed(r);
}

void StoreProxy::HandleRequest(const std::shared_ptr<proto::Channel>& client,
                               wire::StoreRequest request) {
  const uint64_t client_id = request.id();
  std::weak_ptr<proto::Channel> weak = client;
  Submit(std::move(request), [weak, client_id](const wire::StoreResponse& r) {
    auto c = weak.lock();
    if (!c) return;  // the rank went away meanwhile
    wire::Envelope reply;
    *reply.mutable_store_response() = r;
    reply.mutable_store_response()->set_id(client_id);
    (void)c->Send(reply);
    // A rank that does not read its answers is not read either until it does.
    if (c->congested()) c->PauseReading();
  });
}

void StoreProxy::HandleResponse(const wire::StoreResponse& response) {
  auto it = pending_.find(response.id());
  if (it == pending_.end()) return;  // closed meanwhile
  Answer answer = std::move(it->second);
  pending_.erase(it);
  answer(response);
}

void StoreProxy::PauseReading() {
  paused_ = true;
  for (auto& c : clients_) c->PauseReading();
}

void StoreProxy::ResumeReading() {
  if (!paused_) return;
  paused_ = false;
  for (auto& c : clients_) {
    if (!c->congested()) c->ResumeReading();
  }
}

void StoreProxy::Close() {
  boost::system::error_code ignored;
  if (acceptor_.is_open()) {
    acceptor_.close(ignored);
    ::unlink(path_.c_str());
  }
  auto clients = std::move(clients_);
  clients_.clear();
  for (auto& c : clients) c->Close(Status::Ok());
  pending_.clear();
}

}  // namespace dslaunch::agent
