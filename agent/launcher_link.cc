#include "agent/launcher_link.h"

#include <boost/asio/connect.hpp>
#include <boost/asio/ip/tcp.hpp>

#include "proto/channel.h"

namespace dslaunch::agent {

namespace {

namespace asio = boost::asio;
using asio::ip::tcp;

class TcpLink : public LauncherLink {
 public:
  explicit TcpLink(asio::io_context& io) : io_(io) {}
  ~TcpLink() override { Drop(); }

  void SetHandlers(Handlers handlers) override {
    handlers_ = std::move(handlers);
  }

  void Dial(const std::string& host, int port) override {
    Drop();
    auto resolver = std::make_shared<tcp::resolver>(io_);
    auto socket = std::make_shared<tcp::socket>(io_);
    const uint64_t dial = ++dial_;
    resolver->async_resolve(
        host, std::to_string(port),
        [this, dial, host, resolver, socket](
            const boost::system::error_code& ec,
            tcp::resolver::results_type results) {
          if (dial != dial_) return;  // dropped meanwhile
          if (ec)
            return handlers_.dial_failed(
                true, "cannot resolve " + host + ": " + ec.message());
          asio::async_connect(
              *socket, results,
              [this, dial, socket](const boost::system::error_code& ec,
                                   const tcp::endpoint&) {
                if (dial != dial_) return;
                if (ec)
                  return handlers_.dial_failed(
                      false, "cannot connect: " + ec.message());
                socket->set_option(tcp::no_delay(true));
                channel_ = proto::Channel::Create(
                    proto::Channel::Socket(std::move(*socket)), "launcher");
                channel_->Start({
                    .on_message =
                        [this](wire::Envelope&& m) {
                          handlers_.message(std::move(m));
                        },
                    .on_close =
                        [this](const Status& st) { handlers_.closed(st); },
                    .on_drain = [this] { handlers_.drained(); },
                });
                handlers_.connected();
              });
        });
  }

  bool open() const override { return channel_ && !channel_->closed(); }

  Status Send(const wire::Envelope& msg) override {
    if (!channel_) return Unavailable("not connected");
    return channel_->Send(msg);
  }

  bool congested() const override { return open() && channel_->congested(); }

  void Close(const Status& why) override {
    if (channel_) channel_->Close(why);
  }

  void CloseAfterFlush() override {
    if (channel_) channel_->CloseAfterFlush();
  }

 private:
  // A connection given up: closed without a word to the Agent (it is
  // dialling again), and a dial in flight forgotten.
  void Drop() {
    ++dial_;
    if (!channel_) return;
    channel_->SetHandlers({});
    channel_->Close(Status::Ok());
    channel_.reset();
  }

  asio::io_context& io_;
  Handlers handlers_;
  std::shared_ptr<proto::Channel> channel_;
  uint64_t dial_ = 0;
};

}  // namespace

std::unique_ptr<LauncherLink> MakeTcpLink(asio::io_context& io) {
  return std::make_unique<TcpLink>(io);
}

}  // namespace dslaunch::agent
