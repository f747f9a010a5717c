#include "launcher/control_server.h"

#include <spdlog/spdlog.h>

#include "proto/auth.h"
#include "proto/version.h"

namespace dslaunch::launcher {

namespace asio = boost::asio;
using asio::ip::tcp;

struct ControlServer::Handshake {
  explicit Handshake(asio::io_context& io) : timer(io) {}
  std::shared_ptr<proto::Channel> channel;
  std::string peer_addr;
  wire::Hello hello;
  std::string server_nonce;
  std::string secret;  // the node's, once known
  bool welcomed = false;
  asio::steady_timer timer;
};

static constexpr size_t kHandshakeMaxFrameBytes = 64 * 1024;
static constexpr size_t kMaxHandshakesBase = 16;

static std::chrono::milliseconds Ms(double seconds) {
  return std::chrono::milliseconds(static_cast<int64_t>(seconds * 1000));
}

ControlServer::ControlServer(asio::io_context& io, Options options,
                             Delegate* delegate)
    : io_(io),
      options_(std::move(options)),
      delegate_(delegate),
      acceptor_(io),
      heartbeat_timer_(io) {}

ControlServer::~ControlServer() {
  *alive_ = false;  // from here on, handlers do not touch the maps
  for (auto& [n, link] : agents_) link.channel->Close(Status::Ok());
  for (auto& [p, hs] : handshakes_) hs->channel->Close(Status::Ok());
}

StatusOr<int> ControlServer::Listen(const std::string& bind_addr, int port) {
  boost::system::error_code ec;
  auto addr = asio::ip::make_address(bind_addr, ec);
  if (ec) return InvalidArgument("bad listen address '" + bind_addr + "'");
  tcp::endpoint ep(addr, static_cast<unsigned short>(port));
  acceptor_.open(ep.protocol(), ec);
  if (!ec) acceptor_.set_option(tcp::acceptor::reuse_address(true), ec);
  if (!ec) acceptor_.bind(ep, ec);
  if (!ec) acceptor_.listen(asio::socket_base::max_listen_connections, ec);
  if (ec) {
    return Unavailable("cannot listen on " + bind_addr + ":" +
                       std::to_string(port) + ": " + ec.message());
  }
  Accept();
  ArmHeartbeat();
  return static_cast<int>(acceptor_.local_endpoint().port());
}

void ControlServer::Accept() {
  acceptor_.async_accept(
      [this, alive = alive_](boost::system::error_code ec, tcp::socket socket) {
        if (!*alive || ec == asio::error::operation_aborted) return;
        if (!ec) OnAccepted(std::move(socket));
        Accept();
      });
}

void ControlServer::OnAccepted(tcp::socket socket) {
  boost::system::error_code ec;
  socket.set_option(tcp::no_delay(true), ec);
  auto remote = socket.remote_endpoint(ec);
  auto local = socket.local_endpoint(ec);
  auto hs = std::make_shared<Handshake>(io_);
  hs->peer_addr = local.address().to_string();
  const std::string peer =
      remote.address().to_string() + ":" + std::to_string(remote.port());
  // Before authentication a peer gets small frames and a bounded number of
  // concurrent handshakes, so an unauthenticated client cannot make the
  // launcher buffer much.
  if (handshakes_.size() >=
      kMaxHandshakesBase + 2 * static_cast<size_t>(options_.num_nodes)) {
    spdlog::warn(
        "rejected connection from {}: too many unauthenticated connections",
        peer);
    return;  // the socket closes here
  }
  proto::Channel::Limits limits;
  limits.max_frame_bytes = kHandshakeMaxFrameBytes;
  hs->channel = proto::Channel::Create(
      proto::Channel::Socket(std::move(socket)), peer, limits);
  handshakes_[hs.get()] = hs;
  Handshake* key = hs.get();
  hs->channel->Start({
      .on_message =
          [this, key](wire::Envelope&& m) {
            auto it = handshakes_.find(key);
            if (it == handshakes_.end()) return;
            auto hs = it->second;  // a copy: Promote erases the map's entry
            HandleHandshake(hs, std::move(m));
          },
      .on_close =
          [this, key, peer, alive = alive_](const Status& st) {
            if (!*alive) return;
            if (handshakes_.erase(key)) {
              spdlog::warn("rejected connection from {}: {}", peer,
                           st.message());
            }
          },
      .on_drain = nullptr,
  });
  hs->timer.expires_after(Ms(options_.handshake_timeout_s));
  hs->timer.async_wait([hs](const boost::system::error_code& ec) {
    if (!ec) hs->channel->Close(ProtocolError("handshake timed out"));
  });
}

Status ControlServer::CheckHello(const wire::Hello& hello) const {
  if (hello.protocol_version() != kProtocolVersion) {
    return ProtocolError("agent speaks protocol " +
                         std::to_string(hello.protocol_version()) +
                         ", this launcher " + std::to_string(kProtocolVersion) +
                         " (dsagent " + hello.agent_version() + ")");
  }
  if (hello.job_id() != options_.job_id)
    return ProtocolError("agent of another job");
  if (hello.node_rank() < 0 || hello.node_rank() >= options_.num_nodes) {
    return ProtocolError("agent claims node " +
                         std::to_string(hello.node_rank()));
  }
  if (hello.client_nonce().size() != proto::kNonceBytes) {
    return ProtocolError("bad nonce");
  }
  return Status::Ok();
}

void ControlServer::HandleHandshake(const std::shared_ptr<Handshake>& hs,
                                    wire::Envelope&& msg) {
  if (!hs->welcomed && msg.has_hello()) {
    Status st = CheckHello(msg.hello());
    if (!st.ok()) return hs->channel->Close(st);
    hs->hello = std::move(*msg.mutable_hello());
    hs->welcomed = true;
    return SendWelcome(hs);
  }
  if (hs->welcomed && !hs->secret.empty() && msg.has_auth()) {
    const std::string expected = proto::AgentProof(
        hs->secret, hs->hello.client_nonce(), hs->server_nonce);
    if (!proto::ConstantTimeEqual(expected, msg.auth().agent_proof())) {
      return hs->channel->Close(ProtocolError("authentication failed"));
    }
    return Promote(hs);
  }
  hs->channel->Close(ProtocolError("unexpected " + proto::MessageName(msg) +
                                   " before authentication"));
}

void ControlServer::SendWelcome(const std::shared_ptr<Handshake>& hs) {
  if (hs->channel->closed()) return;
  const int node = hs->hello.node_rank();
  std::optional<std::string> secret =
      options_.node_secret ? options_.node_secret(node) : options_.secret;
  if (!secret) {
    // The node's secret is still on its way (through the starter's output):
    // ask again shortly; the handshake timeout bounds the wait.
    auto retry =
        std::make_shared<asio::steady_timer>(io_, std::chrono::milliseconds(5));
    retry->async_wait(
        [this, hs, retry, alive = alive_](const boost::system::error_code& ec) {
          if (!ec && *alive) SendWelcome(hs);
        });
    return;
  }
  hs->secret = *secret;
  hs->server_nonce = proto::RandomBytes(proto::kNonceBytes);
  wire::Envelope welcome;
  welcome.mutable_welcome()->set_protocol_version(kProtocolVersion);
  welcome.mutable_welcome()->set_server_nonce(hs->server_nonce);
  welcome.mutable_welcome()->set_launcher_proof(proto::LauncherProof(
      hs->secret, hs->hello.client_nonce(), hs->server_nonce));
  (void)hs->channel->Send(welcome);
}

void ControlServer::Promote(const std::shared_ptr<Handshake>& hs) {
  const int node = hs->hello.node_rank();
  hs->timer.cancel();
  handshakes_.erase(hs.get());
  if (agents_.count(node)) {
    return hs->channel->Close(
        ProtocolError("a second agent for node " + std::to_string(node)));
  }
  agents_[node] = AgentLink{hs->channel, std::chrono::steady_clock::now()};
  hs->channel->SetMaxFrameBytes(proto::kDefaultMaxFrameBytes);
  hs->channel->SetHandlers({
      .on_message =
          [this, node](wire::Envelope&& m) {
            auto it = agents_.find(node);
            if (it == agents_.end()) return;
            it->second.last_heard = std::chrono::steady_clock::now();
            if (m.has_heartbeat()) return;
            delegate_->OnAgentMessage(node, std::move(m));
          },
      .on_close =
          [this, node, alive = alive_](const Status& st) {
            if (!*alive) return;
            agents_.erase(node);
            delegate_->OnAgentDisconnected(node, st);
          },
      .on_drain = nullptr,
  });
  delegate_->OnAgentAuthenticated(node, hs->hello, hs->peer_addr);
}

Status ControlServer::Send(int node_rank, const wire::Envelope& msg) {
  auto it = agents_.find(node_rank);
  if (it == agents_.end()) {
    return Unavailable("node " + std::to_string(node_rank) +
                       " is not connected");
  }
  return it->second.channel->Send(msg);
}

void ControlServer::ArmHeartbeat() {
  heartbeat_timer_.expires_after(Ms(options_.heartbeat_interval_s));
  heartbeat_timer_.async_wait(
      [this, alive = alive_](const boost::system::error_code& ec) {
        if (ec || !*alive) return;
        const auto now = std::chrono::steady_clock::now();
        wire::Envelope beat;
        beat.mutable_heartbeat()->set_seq(++heartbeat_seq_);
        std::vector<std::shared_ptr<proto::Channel>> silent;
        for (auto& [node, link] : agents_) {
          if (now - link.last_heard > Ms(options_.heartbeat_timeout_s)) {
            silent.push_back(link.channel);
          } else {
            (void)link.channel->Send(beat);
          }
        }
        for (auto& c : silent) {
          c->Close(Unavailable("no heartbeat for " +
                               std::to_string(options_.heartbeat_timeout_s) +
                               " s"));
        }
        ArmHeartbeat();
      });
}

void ControlServer::Shutdown() {
  boost::system::error_code ignored;
  acceptor_.close(ignored);
  heartbeat_timer_.cancel();
  // Closing runs on_close handlers that erase from these maps: iterate
  // over copies.
  auto handshakes = std::move(handshakes_);
  handshakes_.clear();
  for (auto& [p, hs] : handshakes) hs->channel->Close(Status::Ok());
  std::vector<std::shared_ptr<proto::Channel>> agents;
  for (auto& [node, link] : agents_) agents.push_back(link.channel);
  for (auto& c : agents) c->CloseAfterFlush();
}

}  // namespace dslaunch::launcher
