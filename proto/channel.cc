#include "proto/channel.h"

#include <boost/asio/buffer.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/write.hpp>

namespace dslaunch::proto {

namespace asio = boost::asio;

std::shared_ptr<Channel> Channel::Create(Socket socket, std::string peer,
                                         Limits limits) {
  return std::shared_ptr<Channel>(
      new Channel(std::move(socket), std::move(peer), limits));
}

Channel::Channel(Socket socket, std::string peer, Limits limits)
    : socket_(std::move(socket)),
      peer_(std::move(peer)),
      limits_(limits),
      decoder_(limits.max_frame_bytes) {}

void Channel::SetLimits(const Limits& limits) {
  limits_ = limits;
  decoder_.set_max_frame_bytes(limits.max_frame_bytes);
}

void Channel::ResumeReading() {
  if (!paused_) return;
  paused_ = false;
  // Not from inside the caller's stack: frames held meanwhile go first.
  asio::post(socket_.get_executor(),
             [self = shared_from_this()] { self->Deliver(); });
}

void Channel::Start(Handlers handlers) {
  handlers_ = std::move(handlers);
  ReadMore();
}

void Channel::ReadMore() {
  if (closed_ || paused_ || reading_) return;
  if (read_buffer_.size() != limits_.read_buffer_bytes) {
    read_buffer_ = std::string(limits_.read_buffer_bytes, '\0');
  }
  reading_ = true;
  socket_.async_read_some(
      asio::buffer(read_buffer_),
      [self = shared_from_this()](const boost::system::error_code& ec,
                                  size_t n) { self->OnRead(ec, n); });
}

void Channel::OnRead(const boost::system::error_code& ec, size_t n) {
  reading_ = false;
  if (closed_) return;
  if (ec) {
    if (ec == asio::error::eof || ec == asio::error::connection_reset) {
      Close(decoder_.buffered() ? ProtocolError("connection closed mid-frame")
                                : Unavailable("connection closed by peer"));
    } else {
      Close(Unavailable("read failed: " + ec.message()));
    }
    return;
  }
  std::vector<std::string> frames;
  Status st = decoder_.Feed(std::string_view(read_buffer_.data(), n), &frames);
  for (std::string& f : frames) held_.push_back(std::move(f));
  if (!st.ok()) read_error_ = st;
  Deliver();
}

void Channel::Deliver() {
  // Frames that arrived before a bad one are still delivered, in order;
  // while paused they wait here (at most one read buffer's worth).
  while (!held_.empty() && !paused_ && !closed_) {
    std::string payload = std::move(held_.front());
    held_.pop_front();
    StatusOr<wire::Envelope> msg = ParseEnvelope(payload);
    if (!msg.ok()) return Close(msg.status());
    // A copy: the handler may replace the handlers while it runs.
    auto on_message = handlers_.on_message;
    if (on_message) on_message(std::move(msg).value());
  }
  if (closed_ || !held_.empty()) return;
  if (read_error_) return Close(*read_error_);
  ReadMore();
}

Status Channel::Send(const wire::Envelope& msg) {
  if (closed_) return Unavailable("channel to " + peer_ + " is closed");
  if (msg.msg_case() == wire::Envelope::MSG_NOT_SET) {
    return Internal("refusing to send an empty envelope");
  }
  std::string frame = EncodeFrame(msg);
  if (frame.size() - kFrameHeaderBytes > limits_.max_frame_bytes) {
    return Internal("message " + MessageName(msg) + " of " +
                    std::to_string(frame.size()) +
                    " bytes exceeds frame limit");
  }
  if (queued_bytes_ + frame.size() > limits_.hard_queue_bytes) {
    Status st = Unavailable("write queue to " + peer_ + " overflowed (" +
                            std::to_string(queued_bytes_) + " bytes)");
    Close(st);
    return st;
  }
  queued_bytes_ += frame.size();
  write_queue_.push_back(std::move(frame));
  WriteMore();
  return Status::Ok();
}

void Channel::WriteMore() {
  if (writing_ || closed_) return;
  if (write_queue_.empty()) {
    if (close_after_flush_) {
      boost::system::error_code ignored;
      socket_.shutdown(Socket::shutdown_send, ignored);
      Close(Status::Ok());
    }
    return;
  }
  writing_ = true;
  // Coalesce small frames into one write.
  while (write_queue_.size() > 1 && write_queue_.front().size() < 256 * 1024) {
    std::string second = std::move(write_queue_[1]);
    write_queue_.erase(write_queue_.begin() + 1);
    write_queue_.front() += second;
  }
  asio::async_write(
      socket_, asio::buffer(write_queue_.front()),
      [self = shared_from_this()](const boost::system::error_code& ec,
                                  size_t n) { self->OnWrite(ec, n); });
}

void Channel::OnWrite(const boost::system::error_code& ec, size_t n) {
  writing_ = false;
  if (closed_) return;
  if (ec) return Close(Unavailable("write failed: " + ec.message()));
  const bool was_congested = congested();
  queued_bytes_ -= n;
  write_queue_.pop_front();
  auto on_drain = handlers_.on_drain;  // a copy: it may close the channel
  if (was_congested && !congested() && on_drain) on_drain();
  if (closed_) return;
  WriteMore();
}

void Channel::Close(const Status& reason) {
  if (closed_) return;
  closed_ = true;
  boost::system::error_code ignored;
  socket_.close(ignored);
  write_queue_.clear();
  queued_bytes_ = 0;
  std::string().swap(read_buffer_);
  held_.clear();
  // Move the handler out: it may drop the last owner of this channel.
  auto on_close = std::move(handlers_.on_close);
  handlers_ = Handlers();
  if (on_close) on_close(reason);
}

void Channel::CloseAfterFlush() {
  close_after_flush_ = true;
  WriteMore();
}

}  // namespace dslaunch::proto
