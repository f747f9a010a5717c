#include "base/listen.h"

#include <gtest/gtest.h>

namespace dslaunch::base {
namespace {

TEST(ListenAll, EveryAddressOnTheOnePortPickedForTheFirst) {
  boost::asio::io_context io;
  Acceptors acceptors;
  auto port = ListenAll(io, {"127.0.0.1", "127.0.0.2"}, 0, &acceptors);
  ASSERT_TRUE(port.ok()) << port.status().message();
  ASSERT_EQ(acceptors.size(), 2u);
  EXPECT_GT(*port, 0);
  for (const auto& a : acceptors) EXPECT_EQ(a->local_endpoint().port(), *port);
}

TEST(ListenAll, ATakenPortIsUnavailableAndLeavesNothingOpen) {
  boost::asio::io_context io;
  Acceptors first, second;
  auto port = ListenAll(io, {"127.0.0.1"}, 0, &first);
  ASSERT_TRUE(port.ok());
  // The second address is free at that port, the first is not.
  auto again = ListenAll(io, {"127.0.0.2", "127.0.0.1"}, *port, &second);
  ASSERT_FALSE(again.ok());
  EXPECT_EQ(again.status().code(), StatusCode::kUnavailable);
  EXPECT_NE(again.status().message().find("cannot listen on 127.0.0.1:" +
                                          std::to_string(*port)),
            std::string::npos)
      << again.status().message();
  EXPECT_TRUE(second.empty());
}

TEST(ListenAll, BadInputIsRefusedNamingIt) {
  boost::asio::io_context io;
  Acceptors acceptors;
  auto bad = ListenAll(io, {"127.0.0.1", "not-an-ip"}, 0, &acceptors);
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(bad.status().message(), "bad address 'not-an-ip'");
  EXPECT_TRUE(acceptors.empty());
  EXPECT_EQ(ListenAll(io, {}, 0, &acceptors).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(ListenAll(io, {"127.0.0.1"}, 70000, &acceptors).status().code(),
            StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace dslaunch::base
