// StoreProxy lets ranks reach the launcher's key/value store without
// credentials: it listens on a Unix socket (the path in DSLAUNCH_STORE),
// takes framed StoreRequests from ranks, forwards them over the agent's
// authenticated control connection under ids of its own, and routes each
// StoreResponse back to the rank that asked. Flow control: while the agent's
// channel to the launcher is congested the Agent pauses the proxy (no client
// socket is read, so ranks block in their writes); a client that does not
// read its responses is not read either until it does. Owned by the Agent;
// io_context thread only.
#pragma once

#include <boost/asio/io_context.hpp>
#include <boost/asio/local/stream_protocol.hpp>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>

#include "base/status.h"
#include "proto/channel.h"
#include "proto/dslaunch.pb.h"

namespace dslaunch::agent {

class StoreProxy {
 public:
  // Sends a request upstream (to the launcher).
  using Forward = std::function<Status(const wire::StoreRequest&)>;
  // Gets the answer to one submitted request.
  using Answer = std::function<void(const wire::StoreResponse&)>;

  StoreProxy(boost::asio::io_context& io, Forward forward);
  ~StoreProxy();

  Status Listen(const std::string& path);
  // Forwards `request` under an id of the proxy's own; `answer` gets the
  // launcher's response (its id is the request's), or a CLOSED error when the
  // request cannot go out. Dropped unanswered by Close(). Other front ends of
  // the store (the Horovod rendezvous) use this.
  void Submit(wire::StoreRequest request, Answer answer);
  // A response from the launcher, for a request this proxy forwarded.
  void HandleResponse(const wire::StoreResponse& response);
  // Stop and start reading requests from every client (backpressure).
  void PauseReading();
  void ResumeReading();
  bool paused() const { return paused_; }
  void Close();

 private:
  void Accept();
  void HandleRequest(const std::shared_ptr<proto::Channel>& client,
                     wire::StoreRequest request);

  boost::asio::io_context& io_;
  Forward forward_;
  boost::asio::local::stream_protocol::acceptor acceptor_;
  std::string path_;
  std::set<std::shared_ptr<proto::Channel>> clients_;
  std::map<uint64_t, Answer> pending_;
  uint64_t next_id_ = 1;
  bool paused_ = false;
  std::shared_ptr<bool> alive_ = std::make_shared<bool>(true);
};

}  // namespace dslaunch::agent
