// HorovodRendezvous serves what Horovod's Gloo workers expect of horovodrun's
// rendezvous server (HOROVOD_GLOO_RENDEZVOUS_ADDR/_PORT): an HTTP key/value
// store. `PUT /scope/key` sets (body = value); `GET /scope/key` answers 200
// and the value, or 404 while it is missing (workers poll); `DELETE
// /scope/rank` says a worker finished a scope's rendezvous: in an ad-hoc
// scope (a process set's) that key goes at once, and in hvd.init()'s own
// scopes the last member's DELETE clears the scope, so that a later
// hvd.init() meets afresh. It keeps nothing itself: each request becomes a
// request of the job's store (StoreProxy::Submit) under the key
// "horovod/<scope>/<key>", so every node's ranks meet in the launcher's
// store, which is emptied between generations.
//
// Who may talk to it: it listens on 127.0.0.1 only, and serves a connection
// only when the connecting socket belongs to the agent's own user (looked up
// in /proc/net/tcp): the ranks, and nobody another user runs. That is the
// trust boundary of the store's Unix socket (mode 0600) too.
//
// Bounds: kHorovodMaxConnections at once (more wait in the kernel's
// backlog), a request head of kHorovodMaxHeadBytes and a body of
// kHorovodMaxBodyBytes, kHorovodRequestTimeout to send the request; one
// request per connection (the answer closes it). While the store is paused
// (the agent's channel is congested) no new connection is taken. Owned by
// the Agent; io_context thread only.
#pragma once

#include <sys/types.h>  // uid_t

#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "agent/horovod_http.h"
#include "agent/store_proxy.h"
#include "base/status.h"

namespace dslaunch::agent {

inline constexpr size_t kHorovodMaxConnections = 256;
inline constexpr std::chrono::seconds kHorovodRequestTimeout{10};
// Where Horovod's keys live in the job's store.
inline constexpr std::string_view kHorovodKeyPrefix = "horovod/";

class HorovodRendezvous {
 public:
  // `submit` forwards one store request and calls back with its answer
  // (StoreProxy::Submit).
  using Submit = std::function<void(wire::StoreRequest, StoreProxy::Answer)>;

  HorovodRendezvous(boost::asio::io_context& io, Submit submit);
  ~HorovodRendezvous();

  // Listens on 127.0.0.1, on a port of the kernel's choice (port()).
  Status Listen();
  // The members of each scope hvd.init() meets in that this node's ranks
  // use ("global", "local_<host>", "cross_<local rank>"; see
  // HorovodScopes): the last member's DELETE clears the scope.
  void SetScopes(std::map<std::string, int> sizes);
  uint16_t port() const { return port_; }
  void PauseAccepting();
  void ResumeAccepting();
  // Stops listening and closes every connection.
  void Close();
  size_t connections() const { return connections_; }

  // For tests: the user whose connections are served (default: geteuid()),
  // and the time a client has to send its request.
  void set_allowed_uid(uid_t uid) { allowed_uid_ = uid; }
  void set_request_timeout(std::chrono::milliseconds t) {
    request_timeout_ = t;
  }

 private:
  class Connection;
  void Accept();
  void Released();                                // a connection ended
  int ScopeSize(const std::string& scope) const;  // 0: not an init scope

  boost::asio::io_context& io_;
  Submit submit_;
  boost::asio::ip::tcp::acceptor acceptor_;
  uint16_t port_ = 0;
  uid_t allowed_uid_;
  std::chrono::milliseconds request_timeout_ = kHorovodRequestTimeout;
  bool paused_ = false;
  bool accepting_ = false;  // an async_accept is outstanding
  size_t connections_ = 0;
  size_t refused_said_ = 0;  // refusals logged (the first few only)
  std::map<std::string, int> scope_sizes_;
  std::vector<std::weak_ptr<Connection>> open_;
  std::shared_ptr<bool> alive_ = std::make_shared<bool>(true);
};

}  // namespace dslaunch::agent
