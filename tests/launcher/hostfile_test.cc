#include "launcher/hostfile.h"

#include <gtest/gtest.h>

#include <cstdio>   // remove
#include <fstream>  // ofstream
#include <string>
#include <vector>

namespace dslaunch::launcher {
namespace {

// Parses `text` as "hosts.txt" and returns the hosts in order.
std::vector<std::string> HostNames(const Hostfile& hostfile) {
  std::vector<std::string> names;
  for (const HostEntry& entry : hostfile.hosts) names.push_back(entry.host);
  return names;
}

// Returns the error message of parsing `text`, failing if it parses.
std::string ParseError(const std::string& text) {
  StatusOr<Hostfile> result = ParseHostfile(text, "hosts.txt");
  EXPECT_FALSE(result.ok()) << "parsed unexpectedly: " << text;
  if (result.ok()) return "";
  EXPECT_EQ(result.status().code(), StatusCode::kDataError);
  return result.status().message();
}

TEST(Hostfile, ParsesHostsWithDefaultsInFileOrder) {
  StatusOr<Hostfile> result =
      ParseHostfile("node2\nnode1 slots=4\n", "hosts.txt");
  ASSERT_TRUE(result.ok()) << result.status().message();
  EXPECT_EQ(result->path, "hosts.txt");
  ASSERT_EQ(result->hosts.size(), 2u);
  EXPECT_EQ(result->hosts[0].host, "node2");
  EXPECT_EQ(result->hosts[0].slots, 1);
  EXPECT_FALSE(result->hosts[0].max_slots.has_value());
  EXPECT_FALSE(result->hosts[0].port.has_value());
  EXPECT_FALSE(result->hosts[0].user.has_value());
  EXPECT_EQ(result->hosts[0].line, 1);
  EXPECT_EQ(result->hosts[1].host, "node1");
  EXPECT_EQ(result->hosts[1].slots, 4);
  EXPECT_EQ(result->hosts[1].line, 2);
}

TEST(Hostfile, AcceptsKeysInAnyOrderWithTabs) {
  StatusOr<Hostfile> result =
      ParseHostfile("node1\tuser=alice  port=2222\tmax_slots=8 slots=2", "h");
  ASSERT_TRUE(result.ok()) << result.status().message();
  const HostEntry& entry = result->hosts[0];
  EXPECT_EQ(entry.slots, 2);
  EXPECT_EQ(entry.max_slots, 8);
  EXPECT_EQ(entry.port, 2222);
  EXPECT_EQ(entry.user, "alice");
}

TEST(Hostfile, SkipsCommentsAndBlankLinesAndCountsLines) {
  StatusOr<Hostfile> result = ParseHostfile(
      "# cluster\n\n   \nnode1 slots=2 # two "
      "gpus\n\t\n#node9\nnode2#trailing\n",
      "h");
  ASSERT_TRUE(result.ok()) << result.status().message();
  EXPECT_EQ(HostNames(*result), (std::vector<std::string>{"node1", "node2"}));
  EXPECT_EQ(result->hosts[0].slots, 2);
  EXPECT_EQ(result->hosts[0].line, 4);
  EXPECT_EQ(result->hosts[1].line, 7);
}

TEST(Hostfile, ToleratesCrlfLineEndings) {
  StatusOr<Hostfile> result =
      ParseHostfile("node1 slots=2\r\n# c\r\n\r\nnode2\r\n", "h");
  ASSERT_TRUE(result.ok()) << result.status().message();
  EXPECT_EQ(HostNames(*result), (std::vector<std::string>{"node1", "node2"}));
  EXPECT_EQ(result->hosts[0].slots, 2);
  EXPECT_EQ(result->hosts[1].line, 4);
}

TEST(Hostfile, AcceptsLastLineWithoutNewline) {
  StatusOr<Hostfile> result = ParseHostfile("node1\nnode2 slots=3", "h");
  ASSERT_TRUE(result.ok()) << result.status().message();
  EXPECT_EQ(result->hosts[1].slots, 3);
}

TEST(Hostfile, AcceptsIpv4AndNamesWithDotsDashesUnderscores) {
  StatusOr<Hostfile> result = ParseHostfile(
      "10.0.0.1\n127.0.0.2\ngpu-01.cluster_a.example\nNODE9\n", "h");
  ASSERT_TRUE(result.ok()) << result.status().message();
  EXPECT_EQ(HostNames(*result),
            (std::vector<std::string>{"10.0.0.1", "127.0.0.2",
                                      "gpu-01.cluster_a.example", "NODE9"}));
}

TEST(Hostfile, ExpandsRangeKeepingZeroPadding) {
  StatusOr<Hostfile> result =
      ParseHostfile("node[01-04,07] slots=8 port=22\n", "h");
  ASSERT_TRUE(result.ok()) << result.status().message();
  EXPECT_EQ(HostNames(*result),
            (std::vector<std::string>{"node01", "node02", "node03", "node04",
                                      "node07"}));
  for (const HostEntry& entry : result->hosts) {
    EXPECT_EQ(entry.slots, 8);
    EXPECT_EQ(entry.port, 22);
    EXPECT_EQ(entry.line, 1);
  }
}

TEST(Hostfile, ExpandsRangeWithPrefixAndSuffix) {
  StatusOr<Hostfile> result = ParseHostfile("gpu[1-3].cluster\n", "h");
  ASSERT_TRUE(result.ok()) << result.status().message();
  EXPECT_EQ(HostNames(*result),
            (std::vector<std::string>{"gpu1.cluster", "gpu2.cluster",
                                      "gpu3.cluster"}));
}

TEST(Hostfile, RangeWithoutPaddingGrowsDigits) {
  StatusOr<Hostfile> result = ParseHostfile("n[9-11]\nm[098-100]\n", "h");
  ASSERT_TRUE(result.ok()) << result.status().message();
  EXPECT_EQ(
      HostNames(*result),
      (std::vector<std::string>{"n9", "n10", "n11", "m098", "m099", "m100"}));
}

TEST(Hostfile, RangeOfIpAddressSuffix) {
  StatusOr<Hostfile> result = ParseHostfile("127.0.0.[1-2]\n", "h");
  ASSERT_TRUE(result.ok()) << result.status().message();
  EXPECT_EQ(HostNames(*result),
            (std::vector<std::string>{"127.0.0.1", "127.0.0.2"}));
}

TEST(Hostfile, RejectsUnknownTokenWithLineNumber) {
  EXPECT_EQ(ParseError("node1\nnode2\nnode3 slot=4\n"),
            "hosts.txt:3: unknown token 'slot=4' (expected slots=, max_slots=, "
            "port=, user=)");
}

TEST(Hostfile, RejectsBareWordAfterHost) {
  EXPECT_EQ(ParseError("node1 4\n"),
            "hosts.txt:1: unknown token '4' (expected slots=, max_slots=, "
            "port=, user=)");
}

TEST(Hostfile, RejectsLineStartingWithKey) {
  EXPECT_EQ(ParseError("slots=4\n"),
            "hosts.txt:1: expected a host name before 'slots=4'");
}

TEST(Hostfile, RejectsNonNumericSlots) {
  EXPECT_EQ(ParseError("node1 slots=abc\n"),
            "hosts.txt:1: slots must be a positive integer, got 'abc'");
}

TEST(Hostfile, RejectsZeroNegativeEmptyAndOverflowingSlots) {
  EXPECT_EQ(ParseError("node1 slots=0"),
            "hosts.txt:1: slots must be a positive integer, got '0'");
  EXPECT_EQ(ParseError("node1 slots=-2"),
            "hosts.txt:1: slots must be a positive integer, got '-2'");
  EXPECT_EQ(ParseError("node1 slots="),
            "hosts.txt:1: slots must be a positive integer, got ''");
  EXPECT_EQ(ParseError("node1 slots=+3"),
            "hosts.txt:1: slots must be a positive integer, got '+3'");
  EXPECT_EQ(ParseError("node1 slots=99999999999"),
            "hosts.txt:1: slots must be a positive integer, got '99999999999'");
}

TEST(Hostfile, RejectsMaxSlotsBelowSlots) {
  EXPECT_EQ(ParseError("node1 slots=4 max_slots=2\n"),
            "hosts.txt:1: max_slots=2 is less than slots=4");
  EXPECT_EQ(ParseError("node1 max_slots=x\n"),
            "hosts.txt:1: max_slots must be a positive integer, got 'x'");
}

TEST(Hostfile, RejectsPortOutOfRange) {
  EXPECT_EQ(ParseError("node1 port=0\n"),
            "hosts.txt:1: port must be a positive integer, got '0'");
  EXPECT_EQ(ParseError("node1 port=65536\n"),
            "hosts.txt:1: port must be in 1..65535, got '65536'");
  StatusOr<Hostfile> ok = ParseHostfile("node1 port=65535\n", "h");
  ASSERT_TRUE(ok.ok()) << ok.status().message();
  EXPECT_EQ(ok->hosts[0].port, 65535);
}

TEST(Hostfile, RejectsKeyGivenTwiceOnALine) {
  EXPECT_EQ(ParseError("node1 slots=2 slots=4\n"),
            "hosts.txt:1: 'slots' given twice");
  EXPECT_EQ(ParseError("node1 user=a user=b\n"),
            "hosts.txt:1: 'user' given twice");
}

TEST(Hostfile, RejectsEmptyUser) {
  EXPECT_EQ(ParseError("node1\nnode2 user=\n"), "hosts.txt:2: empty user");
}

TEST(Hostfile, RejectsUserThatLooksLikeAnOption) {
  EXPECT_EQ(ParseError("node1 user=-oProxyCommand\n"),
            "hosts.txt:1: invalid user '-oProxyCommand'");
}

TEST(Hostfile, RejectsDuplicateHostWithLineNumber) {
  EXPECT_EQ(ParseError("# hosts\nnode1\nnode2\n\nnode1 slots=2\n"),
            "hosts.txt:5: duplicate host 'node1' (first on line 2)");
}

TEST(Hostfile, RejectsDuplicateHostIgnoringCase) {
  EXPECT_EQ(ParseError("node1\nNode1\n"),
            "hosts.txt:2: duplicate host 'Node1' (first on line 1)");
}

TEST(Hostfile, RejectsDuplicateHostFromRange) {
  EXPECT_EQ(ParseError("node02\nnode[01-03]\n"),
            "hosts.txt:2: duplicate host 'node02' (first on line 1)");
  EXPECT_EQ(ParseError("node[1,1]\n"),
            "hosts.txt:1: duplicate host 'node1' (first on line 1)");
}

TEST(Hostfile, RejectsReversedRange) {
  EXPECT_EQ(ParseError("node[3-1]\n"),
            "hosts.txt:1: malformed range 'node[3-1]': lower bound 3 is "
            "greater than upper "
            "bound 1");
}

TEST(Hostfile, RejectsNonNumericRange) {
  EXPECT_EQ(ParseError("node[a-b]\n"),
            "hosts.txt:1: malformed range 'node[a-b]': 'a-b' is not a number "
            "or number range");
  EXPECT_EQ(ParseError("node[1,,2]\n"),
            "hosts.txt:1: malformed range 'node[1,,2]': '' is not a number or "
            "number range");
  EXPECT_EQ(ParseError("node[1-]\n"),
            "hosts.txt:1: malformed range 'node[1-]': '1-' is not a number or "
            "number range");
  EXPECT_EQ(ParseError("node[1-2-3]\n"),
            "hosts.txt:1: malformed range 'node[1-2-3]': '1-2-3' is not a "
            "number or number "
            "range");
}

TEST(Hostfile, RejectsUnclosedOrUnopenedBracket) {
  EXPECT_EQ(ParseError("node[1-3 slots=2\n"),
            "hosts.txt:1: malformed range 'node[1-3': missing ']'");
  EXPECT_EQ(ParseError("node1-3]\n"),
            "hosts.txt:1: malformed range 'node1-3]': ']' without '['");
}

TEST(Hostfile, RejectsEmptyOrNestedOrSecondBracketGroup) {
  EXPECT_EQ(ParseError("node[]\n"),
            "hosts.txt:1: malformed range 'node[]': empty range");
  EXPECT_EQ(ParseError("r[1-2]n[1-2]\n"),
            "hosts.txt:1: malformed range 'r[1-2]n[1-2]': only one [...] group "
            "is allowed");
  EXPECT_EQ(ParseError("r[1[2]]\n"),
            "hosts.txt:1: malformed range 'r[1[2]]': only one [...] group is "
            "allowed");
}

TEST(Hostfile, RejectsHugeRange) {
  EXPECT_EQ(ParseError("n[1-1000000]\n"),
            "hosts.txt:1: malformed range 'n[1-1000000]': expands to more than "
            "65536 hosts");
}

// Seen as a timeout of tests/fuzz/hostfile_fuzz: many ranges, each under
// the per-range limit, expanded a 1 KB file to millions of hosts.
TEST(Hostfile, RejectsMoreThan65536HostsInTotal) {
  std::string text;
  for (char c = 'a'; c <= 'c'; ++c) text += std::string(1, c) + "[1-30000]\n";
  EXPECT_EQ(ParseError(text),
            "hosts.txt:3: more than 65536 hosts in the hostfile");
}

TEST(Hostfile, AcceptsExactly65536HostsInTotal) {
  StatusOr<Hostfile> result =
      ParseHostfile("a[1-30000]\nb[1-30000]\nc[1-5536]\n", "hosts.txt");
  ASSERT_TRUE(result.ok()) << result.status().message();
  EXPECT_EQ(result->hosts.size(), 65536u);
}

TEST(Hostfile, RejectsHostNameWithShellCharacters) {
  EXPECT_EQ(ParseError("node1\nhost;rm\n"),
            "hosts.txt:2: invalid host name 'host;rm' (allowed: letters, "
            "digits, '.', '-', '_')");
  EXPECT_EQ(ParseError("user@host\n"),
            "hosts.txt:1: invalid host name 'user@host' (allowed: letters, "
            "digits, '.', '-', "
            "'_')");
  EXPECT_EQ(ParseError("n$(id)[1-2]\n"),
            "hosts.txt:1: invalid host name 'n$(id)1' (allowed: letters, "
            "digits, '.', '-', "
            "'_')");
}

TEST(Hostfile, RejectsHostNameThatLooksLikeAnOption) {
  EXPECT_EQ(ParseError("-oProxy\n"),
            "hosts.txt:1: invalid host name '-oProxy' (must not start with '-' "
            "or '.')");
}

TEST(Hostfile, RejectsOverlongHostName) {
  std::string name(254, 'a');
  EXPECT_EQ(ParseError(name + "\n"), "hosts.txt:1: invalid host name '" + name +
                                         "' (longer than 253 characters)");
}

TEST(Hostfile, RejectsMalformedIpv4) {
  EXPECT_EQ(ParseError("10.0.0.256\n"),
            "hosts.txt:1: invalid IPv4 address '10.0.0.256'");
  EXPECT_EQ(ParseError("10.0.0\n"),
            "hosts.txt:1: invalid IPv4 address '10.0.0'");
  EXPECT_EQ(ParseError("10..0.1\n"),
            "hosts.txt:1: invalid IPv4 address '10..0.1'");
}

TEST(Hostfile, RejectsFileWithNoHosts) {
  EXPECT_EQ(ParseError(""), "hosts.txt: no hosts in hostfile");
  EXPECT_EQ(ParseError("# only comments\n\n  \r\n"),
            "hosts.txt: no hosts in hostfile");
}

TEST(Hostfile, LoadsFileFromDisk) {
  std::string path = testing::TempDir() + "hostfile_test_hosts.txt";
  {
    std::ofstream out(path);
    out << "node[1-2] slots=2\n";
  }
  StatusOr<Hostfile> result = LoadHostfile(path);
  std::remove(path.c_str());
  ASSERT_TRUE(result.ok()) << result.status().message();
  EXPECT_EQ(result->path, path);
  EXPECT_EQ(HostNames(*result), (std::vector<std::string>{"node1", "node2"}));
}

TEST(Hostfile, LoadErrorsNameTheFileAndLine) {
  std::string path = testing::TempDir() + "hostfile_test_bad.txt";
  {
    std::ofstream out(path);
    out << "node1\nnode1\n";
  }
  StatusOr<Hostfile> result = LoadHostfile(path);
  std::remove(path.c_str());
  ASSERT_FALSE(result.ok());
  EXPECT_EQ(result.status().message(),
            path + ":2: duplicate host 'node1' (first on line 1)");
}

TEST(Hostfile, LoadOfMissingFileIsDataErrorNamingPathAndReason) {
  StatusOr<Hostfile> result = LoadHostfile("/nonexistent/dir/hosts.txt");
  ASSERT_FALSE(result.ok());
  EXPECT_EQ(result.status().code(), StatusCode::kDataError);
  EXPECT_EQ(result.status().message(),
            "cannot read hostfile '/nonexistent/dir/hosts.txt': No such file "
            "or directory");
}

TEST(Hostfile, LoadOfDirectoryIsDataError) {
  StatusOr<Hostfile> result = LoadHostfile("/");
  ASSERT_FALSE(result.ok());
  EXPECT_EQ(result.status().code(), StatusCode::kDataError);
  EXPECT_EQ(result.status().message(),
            "cannot read hostfile '/': Is a directory");
}

}  // namespace
}  // namespace dslaunch::launcher
