#include "launcher/supervise/control_server.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <boost/asio/ip/v6_only.hpp>
#include <cstdio>

#include "base/unix_time.h"
#include "proto/auth.h"
#include "proto/progress.h"  // EscapeForLog
#include "proto/version.h"

namespace dslaunch::launcher {

namespace asio = boost::asio;
using asio::ip::tcp;

struct ControlServer::Handshake {
  explicit Handshake(asio::io_context& io) : timer(io) {}
  uint64_t seq = 0;  // arrival order
  std::shared_ptr<proto::Channel> channel;
  std::string peer;        // the remote end, for log lines
  std::string agent_addr;  // the address the agent connected from
  wire::Hello hello;
  std::string server_nonce;
  std::string secret;  // the node's, once known
  bool welcomed = false;
  std::string reject_reason;  // set when we close it ourselves
  asio::steady_timer timer;
};

// Before authentication a peer gets small buffers: an unauthenticated
// client cannot make the launcher hold more than ~16 KiB (the frame limit
// leaves room for a Hello listing a few hundred interface addresses).
static proto::Channel::Limits PreAuthLimits() {
  proto::Channel::Limits l;
  l.max_frame_bytes = 16 * 1024;
  l.read_buffer_bytes = 1024;
  l.soft_queue_bytes = 16 * 1024;
  l.hard_queue_bytes = 64 * 1024;
  return l;
}

ControlServer::ControlServer(asio::io_context& io, Options options,
                             Delegate* delegate)
    : io_(io),
      options_(std::move(options)),
      delegate_(delegate),
      heartbeat_timer_(io),
      summary_timer_(io) {}

ControlServer::~ControlServer() {
  *alive_ = false;  // from here on, handlers do not touch the maps
  for (auto& [n, link] : agents_) link.channel->Close(Status::Ok());
  for (auto& [seq, hs] : handshakes_) hs->channel->Close(Status::Ok());
}

StatusOr<int> ControlServer::Listen(const std::vector<std::string>& bind_addrs,
                                    int port) {
  StatusOr<int> bound = base::ListenAll(io_, bind_addrs, port, &acceptors_);
  if (!bound.ok()) {
    return Status(bound.status().code(),
                  "control server: " + bound.status().message());
  }
  for (auto& a : acceptors_) Accept(*a);
  ArmHeartbeat();
  return bound;
}

void ControlServer::Accept(tcp::acceptor& acceptor) {
  acceptor.async_accept([this, &acceptor, alive = alive_](
                            boost::system::error_code ec, tcp::socket socket) {
    if (!*alive || ec == asio::error::operation_aborted) return;
    if (!ec) {
      OnAccepted(std::move(socket));
      return Accept(acceptor);
    }
    // Out of descriptors or memory: do not spin; try again shortly.
    RecordRejection("accept failed", ec.message());
    auto retry = std::make_shared<asio::steady_timer>(
        io_, std::chrono::milliseconds(50));
    retry->async_wait(
        [this, &acceptor, retry, alive](const boost::system::error_code&) {
          if (*alive && acceptor.is_open()) Accept(acceptor);
        });
  });
}

void ControlServer::OnAccepted(tcp::socket socket) {
  boost::system::error_code ec;
  socket.set_option(tcp::no_delay(true), ec);
  auto remote = socket.remote_endpoint(ec);
  if (ec) return RecordRejection("closed before authenticating", "");
  MakeRoom();
  auto hs = std::make_shared<Handshake>(io_);
  hs->seq = next_handshake_++;
  hs->agent_addr = remote.address().to_string();
  hs->peer = remote.address().to_string() + ":" + std::to_string(remote.port());
  hs->channel = proto::Channel::Create(
      proto::Channel::Socket(std::move(socket)), hs->peer, PreAuthLimits());
  handshakes_[hs->seq] = hs;
  const uint64_t seq = hs->seq;
  std::weak_ptr<Handshake> weak = hs;
  hs->channel->Start({
      .on_message =
          [this, seq](wire::Envelope&& m) {
            auto it = handshakes_.find(seq);
            if (it == handshakes_.end()) return;
            auto hs = it->second;  // a copy: Promote erases the map's entry
            HandleHandshake(hs, std::move(m));
          },
      .on_close =
          [this, seq, alive = alive_](const Status& st) {
            if (*alive) OnHandshakeClosed(seq, st);
          },
      .on_drain = nullptr,
  });
  hs->timer.expires_after(base::Millis(options_.handshake_timeout_s));
  hs->timer.async_wait([this, weak](const boost::system::error_code& ec) {
    auto hs = weak.lock();
    if (ec || !hs) return;
    Reject(*hs, "timed out", ProtocolError("handshake timed out"));
  });
}

void ControlServer::OnHandshakeClosed(uint64_t seq, const Status& st) {
  auto it = handshakes_.find(seq);
  if (it == handshakes_.end()) return;  // promoted or shut down
  auto hs = it->second;
  handshakes_.erase(it);
  hs->timer.cancel();
  std::string reason = hs->reject_reason;
  if (reason.empty()) {
    reason = st.code() == StatusCode::kProtocol
                 ? "malformed input"
                 : "closed before authenticating";
  }
  // The reason may quote what the peer sent: escaped and cut short.
  RecordRejection(reason, hs->peer + ": " + proto::EscapeForLog(st.message()));
}

void ControlServer::MakeRoom() {
  const size_t limit =
      kPreAuthBase + kPreAuthPerNode * static_cast<size_t>(options_.num_nodes);
  if (handshakes_.size() < limit) return;
  // The address holding the most pre-auth connections gives up one: its
  // oldest that has not sent a valid Hello, else its oldest welcomed one (a
  // real agent answers the Welcome within a round trip; a flood waits for
  // its deadline). A flood from one address never evicts an agent from
  // another, and a Hello's claim of a node counts for nothing until the
  // secret proves it. The table never grows past the limit.
  std::map<std::string, size_t> per_addr;
  size_t most = 0;
  for (const auto& [seq, hs] : handshakes_)
    most = std::max(most, ++per_addr[hs->agent_addr]);
  std::shared_ptr<Handshake> victim;
  for (const auto& [seq, hs] : handshakes_) {  // oldest first
    if (per_addr[hs->agent_addr] != most) continue;
    if (!hs->welcomed) {
      victim = hs;
      break;
    }
    if (!victim) victim = hs;
  }
  // A copy: closing erases the map's entry.
  if (victim) {
    Reject(*victim, "evicted (pre-auth table full)",
           ProtocolError("evicted for a newer connection"));
  }
}

void ControlServer::Reject(Handshake& hs, const std::string& reason,
                           const Status& why) {
  if (hs.reject_reason.empty()) hs.reject_reason = reason;
  hs.channel->Close(why);
}

void ControlServer::RecordRejection(const std::string& reason,
                                    const std::string& detail) {
  ++rejected_[reason];
  ++rejected_total_[reason];
  if (!detail.empty()) last_rejection_ = reason + " " + detail;
  if (summary_armed_) return;
  summary_armed_ = true;
  summary_timer_.expires_after(
      base::Millis(options_.rejection_summary_interval_s));
  summary_timer_.async_wait(
      [this, alive = alive_](const boost::system::error_code& ec) {
        if (!*alive || ec) return;
        summary_armed_ = false;
        LogRejections();
      });
}

// One line for every rejection since the last one, e.g. "rejected 1200
// unauthenticated connection(s) in the last 10 s: 1190 closed before
// authenticating, 10 timed out (last: timed out 10.0.0.9:4242: ...)".
void ControlServer::LogRejections() {
  if (rejected_.empty()) return;
  int64_t total = 0;
  std::string parts;
  for (const auto& [reason, count] : rejected_) {
    total += count;
    parts += (parts.empty() ? "" : ", ") + std::to_string(count) + " " + reason;
  }
  spdlog::warn(
      "rejected {} unauthenticated connection(s) in the last {} s: {} "
      "(last: {})",
      total, options_.rejection_summary_interval_s, parts, last_rejection_);
  rejected_.clear();
}

Status ControlServer::CheckHello(const wire::Hello& hello) const {
  if (hello.protocol_version() != kProtocolVersion) {
    return ProtocolError(
        "agent speaks protocol " + std::to_string(hello.protocol_version()) +
        ", this launcher " + std::to_string(kProtocolVersion) + " (dsagent " +
        proto::EscapeForLog(hello.agent_version(), 64) + ")");
  }
  if (!options_.join && hello.job_id() != options_.job_id)
    return ProtocolError("agent of another job");
  // A joining agent's claim is checked once it proved the secret: it is
  // then told why it cannot have the node.
  if (options_.join ? hello.node_rank() < -1
                    : (hello.node_rank() < 0 ||
                       hello.node_rank() >= options_.num_nodes)) {
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
    if (!st.ok()) return Reject(*hs, "bad hello", st);
    hs->hello = std::move(*msg.mutable_hello());
    hs->welcomed = true;
    return SendWelcome(hs);
  }
  if (hs->welcomed && !hs->secret.empty() && msg.has_auth()) {
    const std::string expected = proto::AgentProof(
        hs->secret, hs->hello.client_nonce(), hs->server_nonce);
    if (!proto::ConstantTimeEqual(expected, msg.auth().agent_proof())) {
      return Reject(*hs, "authentication failed",
                    ProtocolError("authentication failed"));
    }
    return Promote(hs);
  }
  Reject(*hs, "unexpected message",
         ProtocolError("unexpected " + proto::MessageName(msg) +
                       " before authentication"));
}

void ControlServer::SendWelcome(const std::shared_ptr<Handshake>& hs) {
  if (hs->channel->closed()) return;
  const int node = hs->hello.node_rank();
  std::optional<std::string> secret =
      options_.node_secret ? options_.node_secret(node) : options_.secret;
  if (!secret) {
    // The node's secret is still on its way (through the starter's output):
    // answered when it comes (NodeSecretKnown); the handshake timeout bounds
    // the wait.
    auto& waiting = awaiting_secret_[node];
    std::erase_if(
        waiting, [](const std::weak_ptr<Handshake>& w) { return w.expired(); });
    waiting.push_back(hs);
    return;
  }
  hs->secret = *secret;
  hs->server_nonce = proto::RandomBytes(proto::kNonceBytes);
  wire::Envelope welcome;
  welcome.mutable_welcome()->set_protocol_version(kProtocolVersion);
  welcome.mutable_welcome()->set_server_nonce(hs->server_nonce);
  welcome.mutable_welcome()->set_launcher_proof(proto::LauncherProof(
      hs->secret, hs->hello.client_nonce(), hs->server_nonce));
  welcome.mutable_welcome()->set_heartbeat_interval_s(
      options_.heartbeat_interval_s);
  welcome.mutable_welcome()->set_heartbeat_timeout_s(
      options_.heartbeat_timeout_s);
  (void)hs->channel->Send(welcome);
}

void ControlServer::NodeSecretKnown(int node_rank) {
  auto it = awaiting_secret_.find(node_rank);
  if (it == awaiting_secret_.end()) return;
  const std::vector<std::weak_ptr<Handshake>> waiting = std::move(it->second);
  awaiting_secret_.erase(it);
  for (const auto& weak : waiting) {
    if (auto hs = weak.lock()) SendWelcome(hs);
  }
}

StatusOr<int> ControlServer::NodeForJoiningAgent(int claimed) const {
  const int n = options_.num_nodes;
  if (claimed >= n) {
    return InvalidArgument(
        "this job has " + std::to_string(n) + " node" + (n == 1 ? "" : "s") +
        " (node ranks 0-" + std::to_string(n - 1) +
        "); this agent claims node rank " + std::to_string(claimed));
  }
  if (claimed >= 0) {
    auto it = agents_.find(claimed);
    if (it == agents_.end()) return claimed;
    return InvalidArgument("node rank " + std::to_string(claimed) +
                           " is taken by the agent on " + it->second.who);
  }
  for (int node = 0; node < n; ++node) {
    if (!agents_.count(node)) return node;
  }
  return InvalidArgument("every node rank of this job (" + std::to_string(n) +
                         ") is taken");
}

void ControlServer::Promote(const std::shared_ptr<Handshake>& hs) {
  hs->timer.cancel();
  handshakes_.erase(hs->seq);
  const std::string who =
      (hs->hello.facts().hostname().empty()
           ? std::string("?")
           : proto::EscapeForLog(hs->hello.facts().hostname(), 255)) +
      " (" + hs->agent_addr + ")";
  if (options_.join) {
    StatusOr<int> node = NodeForJoiningAgent(hs->hello.node_rank());
    if (!node.ok()) {
      // It proved the secret: it hears why, and says so where it runs.
      spdlog::warn("refused a joining agent on {}: {}", who,
                   node.status().message());
      wire::Envelope refusal;
      refusal.mutable_abort()->set_reason("refused: " +
                                          node.status().message());
      refusal.mutable_abort()->set_kill_now(true);
      (void)hs->channel->Send(refusal);
      return hs->channel->CloseAfterFlush();
    }
    hs->hello.set_node_rank(*node);
  }
  const int node = hs->hello.node_rank();
  if (agents_.count(node)) {
    // It proved the secret: worth a line of its own.
    spdlog::warn("refused a second agent for node {} from {}", node, hs->peer);
    return hs->channel->Close(
        ProtocolError("a second agent for node " + std::to_string(node)));
  }
  agents_[node] = AgentLink{hs->channel, std::chrono::steady_clock::now(), who};
  hs->channel->SetLimits(proto::Channel::Limits());
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
  // The first heartbeat at once: the agent knows it was accepted (a joining
  // agent's readiness) without waiting an interval.
  wire::Envelope beat;
  beat.mutable_heartbeat()->set_seq(heartbeat_seq_);
  (void)hs->channel->Send(beat);
  delegate_->OnAgentAuthenticated(node, hs->hello, hs->agent_addr);
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
  heartbeat_timer_.expires_after(base::Millis(options_.heartbeat_interval_s));
  heartbeat_timer_.async_wait([this, alive = alive_](
                                  const boost::system::error_code& ec) {
    if (ec || !*alive) return;
    const auto now = std::chrono::steady_clock::now();
    wire::Envelope beat;
    beat.mutable_heartbeat()->set_seq(++heartbeat_seq_);
    std::vector<std::shared_ptr<proto::Channel>> silent;
    for (auto& [node, link] : agents_) {
      if (now - link.last_heard > base::Millis(options_.heartbeat_timeout_s)) {
        silent.push_back(link.channel);
      } else {
        (void)link.channel->Send(beat);
      }
    }
    char timeout[32];
    std::snprintf(timeout, sizeof(timeout), "%g", options_.heartbeat_timeout_s);
    for (auto& c : silent) {
      c->Close(Unavailable(std::string("no heartbeat for ") + timeout + " s"));
    }
    ArmHeartbeat();
  });
}

void ControlServer::Shutdown() {
  boost::system::error_code ignored;
  for (auto& a : acceptors_) a->close(ignored);
  heartbeat_timer_.cancel();
  summary_timer_.cancel();
  summary_armed_ = false;
  LogRejections();
  // Closing runs on_close handlers that erase from these maps: iterate
  // over copies.
  auto handshakes = std::move(handshakes_);
  handshakes_.clear();
  for (auto& [seq, hs] : handshakes) {
    hs->timer.cancel();
    hs->channel->Close(Status::Ok());
  }
  std::vector<std::shared_ptr<proto::Channel>> agents;
  for (auto& [node, link] : agents_) agents.push_back(link.channel);
  for (auto& c : agents) c->CloseAfterFlush();
}

}  // namespace dslaunch::launcher
