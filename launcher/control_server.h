// ControlServer: the launcher's one TCP server. It accepts agents, runs the
// Hello/Welcome/Auth handshake (mutual HMAC proof of the per-job secret) and
// only then hands an agent's channel to the Delegate; before that, anything
// but the handshake closes the connection. It also sends heartbeats to every
// authenticated agent and drops one that stays silent past the timeout.
// Owned by the Launcher; io_context thread only.
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

#include "proto/channel.h"
#include "proto/dslaunch.pb.h"
#include "proto/status.h"

namespace dslaunch::launcher {

// The agents' connections as the Job sees them: the ControlServer, or a fake
// in tests.
class AgentLinks {
 public:
  virtual ~AgentLinks() = default;
  virtual Status Send(int node_rank, const wire::Envelope& msg) = 0;
  // Stops accepting; closes every connection after what is queued.
  virtual void Shutdown() = 0;
};

class ControlServer : public AgentLinks {
 public:
  class Delegate {
   public:
    virtual ~Delegate() = default;
    // An agent proved the secret. The delegate sends it its JobSpec.
    virtual void OnAgentAuthenticated(int node_rank, const wire::Hello& hello,
                                      const std::string& peer_addr) = 0;
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
    double handshake_timeout_s = 10;
  };

  ControlServer(boost::asio::io_context& io, Options options,
                Delegate* delegate);
  ~ControlServer() override;

  // Binds (port 0 = any free port) and starts accepting; returns the port.
  StatusOr<int> Listen(const std::string& bind_addr, int port);
  Status Send(int node_rank, const wire::Envelope& msg) override;
  // Stops accepting; closes every connection after flushing what is queued.
  void Shutdown() override;
  bool connected(int node_rank) const { return agents_.count(node_rank) > 0; }

 private:
  struct Handshake;
  struct AgentLink {
    std::shared_ptr<proto::Channel> channel;
    std::chrono::steady_clock::time_point last_heard;
  };
  void Accept();
  void OnAccepted(boost::asio::ip::tcp::socket socket);
  void HandleHandshake(const std::shared_ptr<Handshake>& hs,
                       wire::Envelope&& msg);
  Status CheckHello(const wire::Hello& hello) const;
  void SendWelcome(const std::shared_ptr<Handshake>& hs);
  void Promote(const std::shared_ptr<Handshake>& hs);
  void ArmHeartbeat();

  boost::asio::io_context& io_;
  Options options_;
  Delegate* delegate_;
  boost::asio::ip::tcp::acceptor acceptor_;
  boost::asio::steady_timer heartbeat_timer_;
  std::map<Handshake*, std::shared_ptr<Handshake>> handshakes_;
  std::map<int, AgentLink> agents_;
  uint64_t heartbeat_seq_ = 0;
  std::shared_ptr<bool> alive_ = std::make_shared<bool>(true);
};

}  // namespace dslaunch::launcher
