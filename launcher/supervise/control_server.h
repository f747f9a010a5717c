// ControlServer: the launcher's one TCP server. It accepts agents, runs the
// Hello/Welcome/Auth handshake (mutual HMAC proof of the per-job secret) and
// only then hands an agent's channel to the Delegate; before that, anything
// but the handshake closes the connection. It also sends heartbeats to every
// authenticated agent and drops one that stays silent past the timeout.
// Owned by the Launcher; io_context thread only.
//
// Hostile peers: every connection that has not authenticated yet gets small
// buffers (1 KiB read buffer, 16 KiB frames, 64 KiB write queue) and a short
// deadline (handshake_timeout_s). The pre-auth table holds at most
// kPreAuthBase + kPreAuthPerNode * num_nodes connections; when it is full,
// the address holding the most of them gives up its oldest one that has not
// yet sent a valid Hello, else its oldest welcomed one: a flood from one
// address cannot evict an agent from another. A Hello's claim of a node
// counts for nothing until the secret proves it (any number may claim one
// node; only a proven claim takes it). Rejections are counted by reason
// and summarised in one log line per summary interval; whatever a peer
// sent is escaped and cut short before it is logged.
#pragma once

#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/steady_timer.hpp>
#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "base/listen.h"
#include "base/status.h"
#include "proto/channel.h"
#include "proto/dslaunch.pb.h"

namespace dslaunch::launcher {

// The agents' connections as the Job sees them: the ControlServer, or a fake
// in tests.
class AgentLinks {
 public:
  virtual ~AgentLinks() = default;
  virtual Status Send(int node_rank, const wire::Envelope& msg) = 0;
  // Stops accepting; closes every connection after what is queued.
  virtual void Shutdown() = 0;
  // node_rank's own secret is known now (Options::node_secret answers): a
  // Hello that waits for it is answered at once.
  virtual void NodeSecretKnown(int node_rank) { (void)node_rank; }
};

class ControlServer : public AgentLinks {
 public:
  class Delegate {
   public:
    virtual ~Delegate() = default;
    // An agent proved the secret (it connected from `agent_addr`). The
    // delegate sends it its JobSpec.
    virtual void OnAgentAuthenticated(int node_rank, const wire::Hello& hello,
                                      const std::string& agent_addr) = 0;
    virtual void OnAgentMessage(int node_rank, wire::Envelope&& msg) = 0;
    // The agent's connection ended (closed, malformed input, heartbeat lost).
    virtual void OnAgentDisconnected(int node_rank, const Status& why) = 0;
  };

  struct Options {
    std::string secret;  // the job's secret, shared by every agent
    // Set when each node has its own secret that arrives later (pdsh):
    // nullopt while it is not known yet.
    std::function<std::optional<std::string>(int node_rank)> node_secret;
    std::string job_id;
    int num_nodes = 0;
    double heartbeat_interval_s = 1;
    double heartbeat_timeout_s = 10;
    double handshake_timeout_s = 3;
    double rejection_summary_interval_s = 10;
    // --launcher join: agents do not know the job id and may claim node -1
    // (any). Each is given its node once it has proved the secret: the one
    // it claimed, else the lowest free one. One whose node is taken or out
    // of range, or that finds every node taken, gets an Abort saying why
    // (naming the agent that holds the node) and is closed.
    bool join = false;
  };

  static constexpr size_t kPreAuthBase = 64;
  static constexpr size_t kPreAuthPerNode = 4;

  ControlServer(boost::asio::io_context& io, Options options,
                Delegate* delegate);
  ~ControlServer() override;

  // Binds every address of `bind_addrs` (numeric, IPv4 or IPv6) on one port
  // (0 = a free port, the same on all) and starts accepting; returns the port.
  StatusOr<int> Listen(const std::vector<std::string>& bind_addrs, int port);
  StatusOr<int> Listen(const std::string& bind_addr, int port) {
    return Listen(std::vector<std::string>{bind_addr}, port);
  }
  Status Send(int node_rank, const wire::Envelope& msg) override;
  // Stops accepting; closes every connection after flushing what is queued.
  void Shutdown() override;
  void NodeSecretKnown(int node_rank) override;
  bool connected(int node_rank) const { return agents_.count(node_rank) > 0; }
  // Connections not authenticated yet.
  size_t pending_handshakes() const { return handshakes_.size(); }
  // Rejected unauthenticated connections since the start, by reason.
  const std::map<std::string, int64_t>& rejections() const {
    return rejected_total_;
  }

 private:
  struct Handshake;
  struct AgentLink {
    std::shared_ptr<proto::Channel> channel;
    std::chrono::steady_clock::time_point last_heard;
    std::string who;  // "host (address)", for refusals
  };
  // join: the node an authenticated agent gets, or why it gets none.
  StatusOr<int> NodeForJoiningAgent(int claimed) const;
  void Accept(boost::asio::ip::tcp::acceptor& acceptor);
  void OnAccepted(boost::asio::ip::tcp::socket socket);
  void OnHandshakeClosed(uint64_t seq, const Status& st);
  void MakeRoom();
  void Reject(Handshake& hs, const std::string& reason, const Status& why);
  void RecordRejection(const std::string& reason, const std::string& detail);
  void LogRejections();
  void HandleHandshake(const std::shared_ptr<Handshake>& hs,
                       wire::Envelope&& msg);
  Status CheckHello(const wire::Hello& hello) const;
  void SendWelcome(const std::shared_ptr<Handshake>& hs);
  void Promote(const std::shared_ptr<Handshake>& hs);
  void ArmHeartbeat();

  boost::asio::io_context& io_;
  Options options_;
  Delegate* delegate_;
  base::Acceptors acceptors_;
  boost::asio::steady_timer heartbeat_timer_;
  boost::asio::steady_timer summary_timer_;
  // Pre-auth connections by arrival order (oldest first).
  std::map<uint64_t, std::shared_ptr<Handshake>> handshakes_;
  uint64_t next_handshake_ = 0;
  // Rejections since the last summary line, and in total, by reason.
  std::map<std::string, int64_t> rejected_;
  std::map<std::string, int64_t> rejected_total_;
  std::string last_rejection_;
  bool summary_armed_ = false;
  std::map<int, AgentLink> agents_;
  // Hellos whose node's secret has not come yet (NodeSecretKnown), by node;
  // no more than the live handshakes (closed ones are dropped on the way).
  std::map<int, std::vector<std::weak_ptr<Handshake>>> awaiting_secret_;
  uint64_t heartbeat_seq_ = 0;
  std::shared_ptr<bool> alive_ = std::make_shared<bool>(true);
};

}  // namespace dslaunch::launcher
