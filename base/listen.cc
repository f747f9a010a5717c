#include "base/listen.h"

namespace dslaunch::base {

namespace asio = boost::asio;
using tcp = asio::ip::tcp;

namespace {

StatusOr<int> BindAll(asio::io_context& io,
                      const std::vector<std::string>& addrs, int port,
                      Acceptors* acceptors) {
  acceptors->clear();
  for (const std::string& addr : addrs) {
    boost::system::error_code ec;
    const auto ip = asio::ip::make_address(addr, ec);
    if (ec) {
      acceptors->clear();
      return InvalidArgument("bad address '" + addr + "'");
    }
    const tcp::endpoint ep(ip, static_cast<unsigned short>(port));
    auto acceptor = std::make_unique<tcp::acceptor>(io);
    acceptor->open(ep.protocol(), ec);
    if (!ec) acceptor->set_option(tcp::acceptor::reuse_address(true), ec);
    if (!ec && ip.is_v6()) acceptor->set_option(asio::ip::v6_only(true), ec);
    if (!ec) acceptor->bind(ep, ec);
    if (!ec) acceptor->listen(asio::socket_base::max_listen_connections, ec);
    if (ec) {
      acceptors->clear();
      return Unavailable("cannot listen on " + addr + ":" +
                         std::to_string(port) + ": " + ec.message());
    }
    port = acceptor->local_endpoint().port();
    acceptors->push_back(std::move(acceptor));
  }
  return port;
}

}  // namespace

StatusOr<int> ListenAll(asio::io_context& io,
                        const std::vector<std::string>& addrs, int port,
                        Acceptors* acceptors) {
  if (addrs.empty()) return InvalidArgument("no address to listen on");
  if (port < 0 || port > 65535)
    return InvalidArgument("bad port " + std::to_string(port));
  StatusOr<int> bound = BindAll(io, addrs, port, acceptors);
  for (int attempt = 0;
       !bound.ok() && port == 0 &&
       bound.status().code() == StatusCode::kUnavailable && attempt < 10;
       ++attempt) {
    bound = BindAll(io, addrs, port, acceptors);
  }
  return bound;
}

}  // namespace dslaunch::base
