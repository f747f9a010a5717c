// Test helper shared by the unit tests that drive an Asio loop.
#ifndef DSLAUNCH_TESTS_COMMON_RUN_UNTIL_H_
#define DSLAUNCH_TESTS_COMMON_RUN_UNTIL_H_

#include <boost/asio/io_context.hpp>
#include <chrono>
#include <functional>

namespace dslaunch::testing {

// Runs `io` until `done()` holds or `timeout` passes; returns done().
inline bool RunUntil(
    boost::asio::io_context& io, const std::function<bool()>& done,
    std::chrono::milliseconds timeout = std::chrono::seconds(5)) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (!done() && std::chrono::steady_clock::now() < deadline) {
    io.restart();
    io.run_for(std::chrono::milliseconds(10));
  }
  return done();
}

}  // namespace dslaunch::testing

#endif  // DSLAUNCH_TESTS_COMMON_RUN_UNTIL_H_
