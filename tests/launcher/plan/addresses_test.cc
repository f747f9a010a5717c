#include "launcher/plan/addresses.h"

#include <gtest/gtest.h>

#include <map>
#include <string>
#include <vector>

namespace dslaunch::launcher {
namespace {

using Addrs = std::vector<std::string>;

// A machine with loopback and 10.0.0.1 (toward 10.0.0.0/24) and
// 192.168.5.1 (toward 192.168.5.0/24); "ghost" does not resolve.
AddressLookup FakeLookup() {
  static const std::map<std::string, std::string> routes = {
      {"127.0.0.1", "127.0.0.1"},
      {"127.0.0.2", "127.0.0.1"},
      {"127.0.0.3", "127.0.0.1"},
      {"localhost", "127.0.0.1"},
      {"::1", "::1"},
      {"10.0.0.1", "10.0.0.1"},
      {"10.0.0.2", "10.0.0.1"},
      {"node3", "10.0.0.1"},
      {"192.168.5.9", "192.168.5.1"}};
  AddressLookup l;
  l.is_local = [](const std::string& h) {
    return h.rfind("127.", 0) == 0 || h == "::1" || h == "localhost" ||
           h == "10.0.0.1" || h == "192.168.5.1";
  };
  l.route_from = [](const std::string& h) {
    auto it = routes.find(h);
    return it == routes.end() ? std::string() : it->second;
  };
  return l;
}

TEST(ChooseControlAddresses, LoopbackOnlyPlanListensOnLoopbackOnly) {
  EXPECT_EQ(ChooseControlAddresses({"127.0.0.1", "127.0.0.2", "localhost"}, "",
                                   "", FakeLookup()),
            Addrs{"127.0.0.1"});
}

TEST(ChooseControlAddresses, Ipv6LoopbackNodesAddIpv6Loopback) {
  EXPECT_EQ(ChooseControlAddresses({"::1"}, "", "", FakeLookup()),
            (Addrs{"127.0.0.1", "::1"}));
}

TEST(ChooseControlAddresses, RemoteNodesGetTheAddressesThatRouteToThem) {
  EXPECT_EQ(ChooseControlAddresses({"10.0.0.2", "node3", "192.168.5.9"}, "", "",
                                   FakeLookup()),
            (Addrs{"10.0.0.1", "192.168.5.1"}));
}

TEST(ChooseControlAddresses, MixedPlanAddsLoopbackForTheLocalNodes) {
  EXPECT_EQ(
      ChooseControlAddresses({"10.0.0.1", "10.0.0.2"}, "", "", FakeLookup()),
      (Addrs{"127.0.0.1", "10.0.0.1"}));
}

TEST(ChooseControlAddresses, ExplicitBindAddressWins) {
  EXPECT_EQ(ChooseControlAddresses({"127.0.0.1"}, "0.0.0.0", "10.0.0.1",
                                   FakeLookup()),
            Addrs{"0.0.0.0"});
}

TEST(ChooseControlAddresses, ControlAddressOfThisMachineIsBoundItself) {
  EXPECT_EQ(
      ChooseControlAddresses({"10.0.0.2"}, "", "192.168.5.1", FakeLookup()),
      Addrs{"192.168.5.1"});
}

TEST(ChooseControlAddresses, ForeignOrNamedControlAddressListensOnWildcard) {
  EXPECT_EQ(
      ChooseControlAddresses({"10.0.0.2"}, "", "203.0.113.7", FakeLookup()),
      Addrs{"0.0.0.0"});
  EXPECT_EQ(
      ChooseControlAddresses({"10.0.0.2"}, "", "2001:db8::7", FakeLookup()),
      Addrs{"::"});
  EXPECT_EQ(
      ChooseControlAddresses({"10.0.0.2"}, "", "head.example", FakeLookup()),
      Addrs{"0.0.0.0"});
}

TEST(ChooseControlAddresses, UnresolvableNodeFallsBackToWildcard) {
  EXPECT_EQ(ChooseControlAddresses({"10.0.0.2", "ghost"}, "", "", FakeLookup()),
            Addrs{"0.0.0.0"});
}

TEST(IsLocalHost, KnowsLoopbackAndRejectsTestNet) {
  EXPECT_TRUE(IsLocalHost("127.0.0.1"));
  EXPECT_TRUE(IsLocalHost("127.0.0.3"));
  EXPECT_TRUE(IsLocalHost("localhost"));
  EXPECT_FALSE(IsLocalHost("192.0.2.1"));  // TEST-NET-1, never local
}

TEST(AddressLookup, SystemRoutesLoopbackToLoopback) {
  AddressLookup l = AddressLookup::System();
  EXPECT_EQ(l.route_from("127.0.0.2"), "127.0.0.1");
  EXPECT_EQ(l.route_from("no-such-host.invalid"), "");
  EXPECT_EQ(ChooseControlAddresses({"127.0.0.1", "127.0.0.2"}, "", "", l),
            Addrs{"127.0.0.1"});
}

TEST(MasterAddrWarning, NoneWhenItNamesNode0ByNameOrAddress) {
  AddressLookup l;
  l.resolve = [](const std::string& h) -> std::vector<std::string> {
    if (h == "node0" || h == "node0.cluster") return {"10.0.0.1"};
    if (h == "node1") return {"10.0.0.2"};
    if (h == "10.0.0.1" || h == "10.0.0.2") return {h};
    return {};
  };
  EXPECT_EQ(MasterAddrWarning("", "node0", "10.0.0.1", l), "");
  EXPECT_EQ(MasterAddrWarning("node0", "node0", "", l), "");
  EXPECT_EQ(MasterAddrWarning("node0.cluster", "node0", "", l), "");
  EXPECT_EQ(MasterAddrWarning("10.0.0.1", "node0", "10.0.0.1", l), "");
  // Node 0 reached by an address its name does not give here (NAT, ssh).
  EXPECT_EQ(MasterAddrWarning("10.0.0.2", "elsewhere", "10.0.0.2", l), "");
  EXPECT_EQ(MasterAddrWarning("node1", "node0", "10.0.0.1", l),
            "warning: --master_addr node1 is not node 0 (node0, 10.0.0.1): the "
            "ranks will rendezvous there, and hang if nothing listens");
  EXPECT_EQ(MasterAddrWarning("typo", "node0", "", l),
            "warning: --master_addr typo does not resolve here and is not "
            "node 0 (node0): the ranks will rendezvous there, and hang if "
            "nothing listens");
}

}  // namespace
}  // namespace dslaunch::launcher
