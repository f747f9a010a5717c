#include "agent/host_check.h"

#include <gtest/gtest.h>

namespace dslaunch::agent {
namespace {

TEST(HostWarnings, WarnsWhenTheHostnameResolvesToLoopback) {
  const auto w = HostWarnings("node7", {"127.0.1.1"});
  ASSERT_EQ(w.size(), 1u);
  EXPECT_NE(w[0].find("hostname 'node7' resolves to 127.0.1.1 (loopback)"),
            std::string::npos)
      << w[0];
  EXPECT_NE(w[0].find("/etc/hosts"), std::string::npos) << w[0];
}

TEST(HostWarnings, NamesEveryLoopbackAddressOnce) {
  const auto w =
      HostWarnings("n", {"127.0.1.1", "10.0.0.5", "::1", "127.0.1.1"});
  ASSERT_EQ(w.size(), 1u);
  EXPECT_NE(w[0].find("resolves to 127.0.1.1, ::1 (loopback)"),
            std::string::npos)
      << w[0];
}

TEST(HostWarnings, SaysNothingForNetworkAddresses) {
  EXPECT_TRUE(
      HostWarnings("n", {"10.0.0.5", "fe80::1", "192.168.1.2"}).empty());
  EXPECT_TRUE(HostWarnings("n", {}).empty());
  EXPECT_TRUE(HostWarnings("n", {"not an address"}).empty());
}

TEST(HostWarnings, CountsAllOf127Slash8AsLoopback) {
  EXPECT_EQ(HostWarnings("n", {"127.255.0.3"}).size(), 1u);
  EXPECT_TRUE(HostWarnings("n", {"128.0.0.1"}).empty());
}

}  // namespace
}  // namespace dslaunch::agent
