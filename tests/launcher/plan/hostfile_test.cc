#include "launcher/plan/hostfile.h"

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
            "hosts.txt:1: slots must be an integer in 1..1024, got 'abc'");
}

TEST(Hostfile, RejectsZeroNegativeEmptyAndOverflowingSlots) {
  const std::string in = "hosts.txt:1: slots must be an integer in 1..1024, ";
  EXPECT_EQ(ParseError("node1 slots=0"), in + "got '0'");
  EXPECT_EQ(ParseError("node1 slots=-2"), in + "got '-2'");
  EXPECT_EQ(ParseError("node1 slots="), in + "got ''");
  EXPECT_EQ(ParseError("node1 slots=+3"), in + "got '+3'");
  EXPECT_EQ(ParseError("node1 slots=99999999999"), in + "got '99999999999'");
  EXPECT_EQ(ParseError("node1 slots=99999999999999999999999999"),
            in + "got '99999999999999999999999999'");
}

TEST(Hostfile, RejectsSlotsAboveTheLimitInsteadOfAllocatingThem) {
  EXPECT_EQ(ParseError("node1\nnode2 slots=2147483647\n"),
            "hosts.txt:2: slots must be an integer in 1..1024, got "
            "'2147483647'");
  EXPECT_EQ(ParseError("node1 slots=1025\n"),
            "hosts.txt:1: slots must be an integer in 1..1024, got '1025'");
  StatusOr<Hostfile> ok = ParseHostfile("node1 slots=1024\n", "h");
  ASSERT_TRUE(ok.ok()) << ok.status().message();
  EXPECT_EQ(ok->hosts[0].slots, kMaxSlotsPerHost);
}

TEST(Hostfile, RejectsMaxSlotsBelowSlotsOrAboveTheLimit) {
  EXPECT_EQ(ParseError("node1 slots=4 max_slots=2\n"),
            "hosts.txt:1: max_slots=2 is less than slots=4");
  EXPECT_EQ(ParseError("node1 max_slots=x\n"),
            "hosts.txt:1: max_slots must be an integer in 1..1024, got 'x'");
  EXPECT_EQ(ParseError("node1 max_slots=2147483648\n"),
            "hosts.txt:1: max_slots must be an integer in 1..1024, got "
            "'2147483648'");
}

TEST(Hostfile, RejectsPortOutOfRange) {
  EXPECT_EQ(ParseError("node1 port=0\n"),
            "hosts.txt:1: port must be an integer in 1..65535, got '0'");
  EXPECT_EQ(ParseError("node1 port=65536\n"),
            "hosts.txt:1: port must be an integer in 1..65535, got '65536'");
  EXPECT_EQ(ParseError("node1 port=-22\n"),
            "hosts.txt:1: port must be an integer in 1..65535, got '-22'");
  EXPECT_EQ(ParseError("node1 port=\n"),
            "hosts.txt:1: port must be an integer in 1..65535, got ''");
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

TEST(Hostfile, RejectsUserThatLooksLikeAnOptionOrHasStrangeCharacters) {
  const std::string rule =
      " (allowed: letters, digits, '.', '-', '_', '@'; not starting with '-'; "
      "at most 256 characters)";
  EXPECT_EQ(ParseError("node1 user=-oProxyCommand\n"),
            "hosts.txt:1: invalid user '-oProxyCommand'" + rule);
  EXPECT_EQ(ParseError("node1 user=a;id\n"),
            "hosts.txt:1: invalid user 'a;id'" + rule);
  EXPECT_EQ(ParseError("node1 user=\xc3\xa9\n"),
            "hosts.txt:1: invalid user '\\xc3\\xa9'" + rule);
  EXPECT_EQ(ParseError("node1 user=" + std::string(257, 'u') + "\n"),
            "hosts.txt:1: invalid user '" + std::string(257, 'u') + "'" + rule);
  StatusOr<Hostfile> ok = ParseHostfile("n1 user=alice.b@corp\n", "h");
  ASSERT_TRUE(ok.ok()) << ok.status().message();
  EXPECT_EQ(ok->hosts[0].user, "alice.b@corp");
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

TEST(Hostfile, RejectsEmptyOrNestedBracketGroups) {
  EXPECT_EQ(ParseError("node[]\n"),
            "hosts.txt:1: malformed range 'node[]': empty range");
  EXPECT_EQ(ParseError("r[1[2]]\n"),
            "hosts.txt:1: malformed range 'r[1[2]]': '[' inside [...]");
}

TEST(Hostfile, SeveralBracketGroupsMultiplyAsInSlurm) {
  StatusOr<Hostfile> result = ParseHostfile("r[1-2]n[08-09] slots=2\n", "h");
  ASSERT_TRUE(result.ok()) << result.status().message();
  std::vector<std::string> names;
  for (const auto& h : result->hosts) names.push_back(h.host);
  EXPECT_EQ(names,
            (std::vector<std::string>{"r1n08", "r1n09", "r2n08", "r2n09"}));
}

TEST(Hostlist, NamesOverTheHostNameLimitAreRefusedBeforeExpanding) {
  const std::string a250(250, 'a');
  auto names = ExpandHostRange(a250 + "[0-999]", 65536);
  ASSERT_TRUE(names.ok()) << names.status().message();  // 253 characters
  EXPECT_EQ(names->size(), 1000u);
  // Found by hostfile_fuzz: long names times several groups made megabytes
  // of names, all invalid, before any was checked (a 10 s timeout).
  const std::string long_text = "[0-39][0-39]" + std::string(2300, 'T') + "[7]";
  auto refused = ExpandHostRange(long_text, 65536);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find(
                "(its names are longer than 253 characters)"),
            std::string::npos)
      << refused.status().message();
  EXPECT_FALSE(ExpandHostRange(std::string(251, 'a') + "[0-999]", 65536).ok());
}

TEST(Hostlist, ExpandsSlurmNodeLists) {
  auto hosts = ExpandHostlist("gpu-a[001-003,010],gpu-b7,r[1-2]-n[1,3]");
  ASSERT_TRUE(hosts.ok()) << hosts.status().message();
  EXPECT_EQ(*hosts, (std::vector<std::string>{
                        "gpu-a001", "gpu-a002", "gpu-a003", "gpu-a010",
                        "gpu-b7", "r1-n1", "r1-n3", "r2-n1", "r2-n3"}));
  EXPECT_EQ(*ExpandHostlist("node1"), (std::vector<std::string>{"node1"}));
}

TEST(Hostlist, RefusesMalformedListsNamingThem) {
  EXPECT_EQ(ExpandHostlist("a,,b").status().message(),
            "empty host name in host list 'a,,b'");
  EXPECT_EQ(ExpandHostlist("").status().message(),
            "empty host name in host list ''");
  EXPECT_EQ(ExpandHostlist("n[1-3").status().message(),
            "malformed range 'n[1-3': missing ']'");
  EXPECT_EQ(ExpandHostlist("n[1-3],m;x").status().message(),
            "invalid host name 'm;x' (allowed: letters, digits, '.', '-', "
            "'_')");
  EXPECT_FALSE(ExpandHostlist("a[0-999]b[0-999]").ok());  // 10^6 > 65536
  EXPECT_FALSE(ExpandHostlist("a[1-2]", 1).ok());
}

TEST(Hostfile, RejectsHugeRange) {
  EXPECT_EQ(ParseError("n[1-1000000]\n"),
            "hosts.txt:1: malformed range 'n[1-1000000]': expands to more than "
            "65536 hosts (the limit per hostfile)");
  EXPECT_EQ(ParseError("a\nnode[0-9999999]\n"),
            "hosts.txt:2: malformed range 'node[0-9999999]': expands to more "
            "than 65535 hosts, the room left under the limit of 65536 hosts "
            "per hostfile");
  EXPECT_EQ(ParseError("n[0-9999999999]\n"),
            "hosts.txt:1: malformed range 'n[0-9999999999]': '0-9999999999' "
            "has more than 9 digits");
  EXPECT_EQ(ParseError("n[99999999999999999999999]\n"),
            "hosts.txt:1: malformed range 'n[99999999999999999999999]': "
            "'99999999999999999999999' is not a number or number range");
}

TEST(Hostfile, AcceptsExactlyTheHostLimitAcrossLines) {
  StatusOr<Hostfile> ok =
      ParseHostfile("a[0-32767]\nb[0-32767]\n", "hosts.txt");
  ASSERT_TRUE(ok.ok()) << ok.status().message();
  EXPECT_EQ(ok->hosts.size(), static_cast<size_t>(kMaxHosts));
  EXPECT_EQ(ParseError("a[0-32767]\nb[0-32767]\nc\n"),
            "hosts.txt:3: more than 65536 hosts (the limit per hostfile)");
  EXPECT_EQ(ParseError("a[0-32767]\nb[0-32768]\n"),
            "hosts.txt:2: malformed range 'b[0-32768]': expands to more than "
            "32768 hosts, the room left under the limit of 65536 hosts per "
            "hostfile");
}

TEST(Hostfile, RejectsMoreSlotsInTotalThanTheRankLimit) {
  EXPECT_EQ(ParseError("a[0-1023] slots=1024\nb slots=1\n"),
            "hosts.txt:2: more than 1048576 slots in the hostfile (the limit "
            "on ranks in a job)");
  EXPECT_EQ(ParseError("a[0-1024] slots=1024\n"),
            "hosts.txt:1: more than 1048576 slots in the hostfile (the limit "
            "on ranks in a job)");
}

TEST(Hostfile, RejectsNulAndControlBytesNamingTheColumn) {
  EXPECT_EQ(ParseError(std::string("a\nno\0de1 slots=2\n", 17)),
            "hosts.txt:2: control character '\\x00' in column 3 (is this a "
            "text file?)");
  EXPECT_EQ(ParseError("a\x1b[31m\n"),
            "hosts.txt:1: control character '\\x1b' in column 2 (is this a "
            "text file?)");
  EXPECT_EQ(ParseError(std::string("a # \0 in a comment\n", 19)),
            "hosts.txt:1: control character '\\x00' in column 5 (is this a "
            "text file?)");
}

TEST(Hostfile, QuotesNonAsciiBytesEscapedInMessages) {
  EXPECT_EQ(ParseError("n\xe9\x9b\n"),
            "hosts.txt:1: invalid host name 'n\\xe9\\x9b' (allowed: letters, "
            "digits, '.', '-', '_')");
}

TEST(Hostfile, RejectsOverlongLineNamingIt) {
  std::string line = "a slots=1 " + std::string(kMaxLineBytes, ' ') + "\n";
  EXPECT_EQ(ParseError("ok\n" + line),
            "hosts.txt:2: line is longer than 65536 bytes");
  std::string comment = "b # " + std::string(kMaxLineBytes - 10, 'x') + "\n";
  EXPECT_TRUE(ParseHostfile(comment, "h").ok());
}

TEST(Hostfile, CrlfWithKeysAndCommentsParses) {
  StatusOr<Hostfile> ok = ParseHostfile(
      "a slots=2 port=22\r\n# c\r\n\r\nb user=u\r\n", "hosts.txt");
  ASSERT_TRUE(ok.ok()) << ok.status().message();
  ASSERT_EQ(ok->hosts.size(), 2u);
  EXPECT_EQ(ok->hosts[0].port, 22);
  EXPECT_EQ(ok->hosts[1].user, "u");
  EXPECT_EQ(ok->hosts[1].line, 4);
}

// Seen as a timeout of tests/fuzz/hostfile_fuzz: many ranges, each under
// the per-range limit, expanded a 1 KB file to millions of hosts.
TEST(Hostfile, RejectsMoreThan65536HostsInTotal) {
  std::string text;
  for (char c = 'a'; c <= 'c'; ++c) text += std::string(1, c) + "[1-30000]\n";
  const std::string error = ParseError(text);
  EXPECT_EQ(error.rfind("hosts.txt:3: ", 0), 0u) << error;
  EXPECT_NE(error.find("limit of 65536 hosts per hostfile"), std::string::npos)
      << error;
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

TEST(Hostfile, LoadOfFileAboveTheSizeLimitIsDataErrorNamingIt) {
  const std::string path = ::testing::TempDir() + "huge_hostfile.txt";
  {
    std::ofstream out(path);
    std::string comments(1 << 16, '#');
    comments.back() = '\n';
    for (size_t i = 0; i <= kMaxHostfileBytes >> 16; ++i) out << comments;
  }
  StatusOr<Hostfile> result = LoadHostfile(path);
  std::remove(path.c_str());
  ASSERT_FALSE(result.ok());
  EXPECT_EQ(result.status().code(), StatusCode::kDataError);
  EXPECT_EQ(result.status().message(),
            path + ": larger than 16 MiB (the limit for a hostfile)");
}

TEST(Hostfile, LoadOfDirectoryIsDataError) {
  StatusOr<Hostfile> result = LoadHostfile("/");
  ASSERT_FALSE(result.ok());
  EXPECT_EQ(result.status().code(), StatusCode::kDataError);
  EXPECT_EQ(result.status().message(),
            "cannot read hostfile '/': Is a directory");
}

TEST(Quoted, EscapesWhatIsNotPrintableAsciiAndCutsLongText) {
  EXPECT_EQ(Quoted("node-1"), "'node-1'");
  EXPECT_EQ(Quoted("a\x1b[2Jb\n\xff"), "'a\\x1b[2Jb\\x0a\\xff'");
  EXPECT_EQ(Quoted(std::string(400, 'x')),
            "'" + std::string(300, 'x') + "'...");
}

TEST(HostKey, MatchesNamesAsDnsDoes) {
  EXPECT_EQ(HostKey("GPU-A01.Example.ORG"), "gpu-a01.example.org");
  EXPECT_EQ(HostKey(HostKey("Node")), HostKey("NODE"));
}

}  // namespace
}  // namespace dslaunch::launcher
