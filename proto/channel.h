// Channel: one framed, message-oriented connection (TCP or Unix stream) on an
// Asio io_context. Reads frames and hands each parsed Envelope to a handler;
// writes go through a bounded queue. A malformed or oversized frame, a read
// or write error, or an overfull queue closes the channel and reports the
// reason once through on_close. Reading can be paused (backpressure toward
// the peer) and every buffer is bounded by Limits. Owned through shared_ptr;
// use only from the io_context's thread.
#pragma once

#include <boost/asio/generic/stream_protocol.hpp>
#include <boost/asio/io_context.hpp>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "base/status.h"
#include "proto/dslaunch.pb.h"
#include "proto/frame_codec.h"

namespace dslaunch::proto {

class Channel : public std::enable_shared_from_this<Channel> {
 public:
  using Socket = boost::asio::generic::stream_protocol::socket;

  struct Limits {
    size_t max_frame_bytes = kDefaultMaxFrameBytes;
    // Above this, congested() is true: producers should pause (backpressure).
    size_t soft_queue_bytes = 8u << 20;
    // Above this, Send fails and the channel closes: the peer stopped reading.
    size_t hard_queue_bytes = 256u << 20;
    // Size of the one read buffer (small for peers not yet trusted).
    size_t read_buffer_bytes = 64u << 10;
  };
  struct Handlers {
    std::function<void(wire::Envelope&&)> on_message;
    // Called once, when the channel closes for any reason: OK when closed by
    // Close(Status::Ok()) or CloseAfterFlush(); Unavailable when the peer
    // ended the stream (for us a lost peer), ProtocolError for bad input.
    std::function<void(const Status&)> on_close;
    // Called when the write queue drops below the soft limit again.
    std::function<void()> on_drain;
  };

  static std::shared_ptr<Channel> Create(Socket socket, std::string peer,
                                         Limits limits);
  static std::shared_ptr<Channel> Create(Socket socket, std::string peer) {
    return Create(std::move(socket), std::move(peer), Limits());
  }

  void Start(Handlers handlers);
  // Replaces the handlers of a started channel (e.g. after a handshake);
  // safe to call from inside on_message.
  void SetHandlers(Handlers handlers) { handlers_ = std::move(handlers); }
  // Replaces the limits from now on (e.g. small before authentication, the
  // full size after); a new read buffer size applies from the next read.
  void SetLimits(const Limits& limits);
  // Stops delivering and reading until ResumeReading (the peer's writes then
  // block once the socket buffers fill); frames read meanwhile wait.
  void PauseReading() { paused_ = true; }
  void ResumeReading();
  // Queues `msg`. Fails when the channel is closed or the queue is over the
  // hard limit (which also closes the channel).
  Status Send(const wire::Envelope& msg);
  // Closes now; pending writes are dropped. on_close gets `reason`.
  void Close(const Status& reason);
  // Writes what is queued, then closes (on_close gets OK).
  void CloseAfterFlush();

  bool closed() const { return closed_; }
  bool reading_paused() const { return paused_; }
  bool congested() const { return queued_bytes_ > limits_.soft_queue_bytes; }
  size_t queued_bytes() const { return queued_bytes_; }
  const std::string& peer() const { return peer_; }

 private:
  Channel(Socket socket, std::string peer, Limits limits);
  void ReadMore();
  void OnRead(const boost::system::error_code& ec, size_t n);
  void Deliver();
  void WriteMore();
  void OnWrite(const boost::system::error_code& ec, size_t n);

  Socket socket_;
  std::string peer_;
  Limits limits_;
  Handlers handlers_;
  FrameDecoder decoder_;
  std::string read_buffer_;
  std::deque<std::string> held_;      // read, not yet delivered
  std::optional<Status> read_error_;  // bad input after the held frames
  std::deque<std::string> write_queue_;
  size_t queued_bytes_ = 0;
  bool writing_ = false;
  bool reading_ = false;  // a read is in flight
  bool paused_ = false;
  bool closed_ = false;
  bool close_after_flush_ = false;
};

}  // namespace dslaunch::proto
