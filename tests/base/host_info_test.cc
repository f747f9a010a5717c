#include "base/host_info.h"

#include <gtest/gtest.h>
#include <sched.h>

#include <algorithm>
#include <string>

namespace dslaunch::base {
namespace {

TEST(JoinHostPort, BracketsIpv6LiteralsOnly) {
  EXPECT_EQ(JoinHostPort("10.0.0.7", 29500), "10.0.0.7:29500");
  EXPECT_EQ(JoinHostPort("::1", 80), "[::1]:80");
  EXPECT_EQ(JoinHostPort("node-3.example", 1), "node-3.example:1");
}

TEST(SplitHostPort, InvertsJoinHostPort) {
  for (const char* host : {"10.0.0.7", "fe80::1", "node-3.example"}) {
    std::string h;
    int p = 0;
    ASSERT_TRUE(SplitHostPort(JoinHostPort(host, 65535), &h, &p).ok()) << host;
    EXPECT_EQ(h, host);
    EXPECT_EQ(p, 65535);
  }
}

TEST(SplitHostPort, RejectsMissingPartsAndBadPorts) {
  for (const char* bad : {"", "host", ":1", "host:", "host:0", "host:65536",
                          "[::1:80", "[]:80", "host: 80"}) {
    std::string h = "unchanged";
    int p = 7;
    EXPECT_EQ(SplitHostPort(bad, &h, &p).code(), StatusCode::kInvalidArgument)
        << bad;
    EXPECT_EQ(h, "unchanged");
    EXPECT_EQ(p, 7);
  }
}

TEST(RouteTo, LoopbackRoutesFromLoopbackAndUnknownNamesAreNotFound) {
  StatusOr<Route> r = RouteTo("127.0.0.3");
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_EQ(r->local, "127.0.0.1");
  EXPECT_EQ(r->peer, "127.0.0.3");
  EXPECT_EQ(RouteTo("no-such-host.invalid").status().code(),
            StatusCode::kNotFound);
}

TEST(InterfaceAddresses, IncludesLoopbackOnlyWhenAsked) {
  const auto with = InterfaceAddresses(true);
  const auto without = InterfaceAddresses(false);
  EXPECT_NE(std::find(with.begin(), with.end(), "127.0.0.1"), with.end());
  EXPECT_EQ(std::find(without.begin(), without.end(), "127.0.0.1"),
            without.end());
}

TEST(CpuList, ParsesLinuxCpuListsAndWritesThemBack) {
  auto cpus = ParseCpuList("1,3-5,7");
  ASSERT_TRUE(cpus.ok()) << cpus.status().message();
  EXPECT_EQ(*cpus, (std::vector<int>{1, 3, 4, 5, 7}));
  EXPECT_EQ(CpuListString(*cpus), "1,3-5,7");
  EXPECT_EQ(CpuListString({0, 1, 2, 3}), "0-3");
  EXPECT_EQ(CpuListString({}), "");
  EXPECT_EQ(*ParseCpuList("1023"), (std::vector<int>{1023}));
}

TEST(CpuList, RefusesAnythingElse) {
  for (const char* bad : {"", "1,", ",1", "a", "1-", "-1", "3-1", "1-2-3",
                          "1024", "99999", "1,1", "0-3,2", " 1"}) {
    auto cpus = ParseCpuList(bad);
    EXPECT_FALSE(cpus.ok()) << "'" << bad << "'";
  }
  EXPECT_EQ(ParseCpuList("1,x").status().message(),
            "'x' is not a CPU or a range lo-hi of CPUs below 1024");
  EXPECT_EQ(ParseCpuList("0-3,2").status().message(), "CPU 2 given twice");
}

TEST(UsableCores, AreCpusWeMayRunOnOnePerCore) {
  const std::vector<int> cores = UsableCores();
  ASSERT_FALSE(cores.empty());
  cpu_set_t mask;
  ASSERT_EQ(::sched_getaffinity(0, sizeof(mask), &mask), 0);
  for (size_t i = 0; i < cores.size(); ++i) {
    EXPECT_TRUE(CPU_ISSET(cores[i], &mask)) << cores[i];
    if (i > 0) {
      EXPECT_LT(cores[i - 1], cores[i]);
    }
  }
  EXPECT_LE(cores.size(), static_cast<size_t>(CPU_COUNT(&mask)));
}

TEST(InterfaceWithAddress, NamesLoopbackAndNothingForAForeignAddress) {
  EXPECT_EQ(InterfaceWithAddress("127.0.0.1"), "lo");
  EXPECT_EQ(InterfaceWithAddress("192.0.2.123"), "");  // TEST-NET-1
  EXPECT_EQ(InterfaceWithAddress(""), "");
}

}  // namespace
}  // namespace dslaunch::base
