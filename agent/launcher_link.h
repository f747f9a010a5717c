// LauncherLink: the agent's connection to its launcher as the Agent sees
// it: dialled (again, while a joining agent waits for its launcher), framed
// messages both ways, backpressure, and one report of its end. TcpLink is
// the real one (resolve, connect, a proto::Channel over TCP); the Agent's
// tests drive it through a fake. io_context thread only.
#pragma once

#include <boost/asio/io_context.hpp>
#include <functional>
#include <memory>
#include <string>

#include "base/status.h"
#include "proto/dslaunch.pb.h"

namespace dslaunch::agent {

class LauncherLink {
 public:
  struct Handlers {
    // Dial's end: connected (the Hello may go), or why not.
    std::function<void()> connected;
    // `resolving`: the launcher's name did not resolve (else it did not
    // accept the connection); `why` says what failed.
    std::function<void(bool resolving, const std::string& why)> dial_failed;
    std::function<void(wire::Envelope&&)> message;
    // Once per connection, when it closes for any reason: OK when closed
    // by Close(Status::Ok()) or CloseAfterFlush(); Unavailable when the
    // launcher ended it; ProtocolError for bad input.
    std::function<void(const Status&)> closed;
    // The queue toward the launcher dropped below its soft limit again.
    std::function<void()> drained;
  };

  virtual ~LauncherLink() = default;
  virtual void SetHandlers(Handlers handlers) = 0;
  // Connects to host:port; `connected` or `dial_failed` follows. A
  // connection still held is dropped first.
  virtual void Dial(const std::string& host, int port) = 0;
  // Connected and not closed.
  virtual bool open() const = 0;
  // Queues `msg`; fails when not open or when the launcher stopped reading
  // (which closes the link).
  virtual Status Send(const wire::Envelope& msg) = 0;
  // Over the soft limit: the Agent stops reading its ranks' output.
  virtual bool congested() const = 0;
  // Closes now (what is queued is dropped); `closed` gets `why`.
  virtual void Close(const Status& why) = 0;
  // Writes what is queued, then closes (`closed` gets OK).
  virtual void CloseAfterFlush() = 0;
};

// TCP (no delay) to the launcher, framed by a proto::Channel.
std::unique_ptr<LauncherLink> MakeTcpLink(boost::asio::io_context& io);

}  // namespace dslaunch::agent
