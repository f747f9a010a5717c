// ListenAll: TCP acceptors on every address of a list at one port, for the
// launcher's servers (the control server, the metrics endpoint). With port 0
// the first address picks a free port and the others take the same one;
// when another address has it taken already, the whole set is tried again
// with a new port (10 times at most). Each acceptor is IPv6-only on an IPv6
// address (a v4 address of the list gets its own), with SO_REUSEADDR and
// the system's longest backlog. io_context thread.
#pragma once

#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/ip/v6_only.hpp>
#include <memory>
#include <string>
#include <vector>

#include "base/status.h"

namespace dslaunch::base {

using Acceptors = std::vector<std::unique_ptr<boost::asio::ip::tcp::acceptor>>;

// Opens *acceptors (replacing what it held) and returns the port. On error
// nothing is left open: InvalidArgument "bad address 'A'" when an address
// is none, Unavailable "cannot listen on A:P: why" when one cannot listen,
// InvalidArgument for an empty list or a port outside 0..65535.
StatusOr<int> ListenAll(boost::asio::io_context& io,
                        const std::vector<std::string>& addrs, int port,
                        Acceptors* acceptors);

}  // namespace dslaunch::base
