#include "agent/agent_args.h"

#include <gtest/gtest.h>
#include <unistd.h>  // pipe, write, close

#include <cstdlib>  // putenv, getenv
#include <string>

namespace dslaunch::agent {
namespace {

TEST(ParseConnect, TakesHostAndPortIncludingBracketedIpv6) {
  std::string host;
  int port = 0;
  ASSERT_TRUE(ParseConnect("10.0.0.7:29500", &host, &port).ok());
  EXPECT_EQ(host, "10.0.0.7");
  EXPECT_EQ(port, 29500);
  ASSERT_TRUE(ParseConnect("[fe80::1]:65535", &host, &port).ok());
  EXPECT_EQ(host, "fe80::1");
  EXPECT_EQ(port, 65535);
  ASSERT_TRUE(ParseConnect("node-3.example:1", &host, &port).ok());
  EXPECT_EQ(host, "node-3.example");
}

TEST(ParseConnect, RejectsMalformedAddressesNamingThem) {
  for (const char* bad :
       {"", "host", ":29500", "host:", "host:0", "host:65536", "host:12ab",
        "host:-1", "[::1:80", "[]:80", "host: 80"}) {
    std::string host = "unchanged";
    int port = 7;
    const Status st = ParseConnect(bad, &host, &port);
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << bad;
    EXPECT_NE(st.message().find(std::string("'") + bad + "'"),
              std::string::npos)
        << st.message();
    EXPECT_EQ(host, "unchanged");
    EXPECT_EQ(port, 7);
  }
}

TEST(NodeRankInHosts, FindsTheExactNameOnly) {
  EXPECT_EQ(*NodeRankInHosts("a,b,c", "a"), 0);
  EXPECT_EQ(*NodeRankInHosts("a,b,c", "c"), 2);
  EXPECT_EQ(*NodeRankInHosts("node1,node10", "node10"), 1);
  const auto missing = NodeRankInHosts("node1,node10", "node");
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find("--node_host node is not in"),
            std::string::npos);
}

std::string FromPipe(const std::string& data, bool* ok) {
  int fds[2];
  EXPECT_EQ(::pipe(fds), 0);
  EXPECT_EQ(::write(fds[1], data.data(), data.size()),
            static_cast<ssize_t>(data.size()));
  ::close(fds[1]);
  std::string line;
  *ok = ReadSecretLine(fds[0], &line);
  char rest[8];
  // What follows the line is left for the lifeline.
  const ssize_t left = ::read(fds[0], rest, sizeof rest);
  ::close(fds[0]);
  return line + "|" + std::string(rest, left > 0 ? left : 0);
}

TEST(ReadSecretLine, ReadsOneLineAndLeavesTheRest) {
  bool ok = false;
  EXPECT_EQ(FromPipe("abc123\nmore", &ok), "abc123|more");
  EXPECT_TRUE(ok);
  EXPECT_EQ(FromPipe("no-newline", &ok), "no-newline|");
  EXPECT_TRUE(ok);
  FromPipe("", &ok);
  EXPECT_FALSE(ok);
  FromPipe(std::string(5000, 'x') + "\n", &ok);
  EXPECT_FALSE(ok);
}

TEST(TakeVariable, ReturnsTheValueAndWipesItsCopyInTheEnvironment) {
  static char entry[] = "DSL_TAKE_TEST=k3y";
  ASSERT_EQ(::putenv(entry), 0);
  auto value = TakeVariable("DSL_TAKE_TEST");
  ASSERT_TRUE(value.ok()) << value.status().message();
  EXPECT_EQ(*value, "k3y");
  EXPECT_EQ(std::getenv("DSL_TAKE_TEST"), nullptr);
  // What /proc/self/environ would still show of it, had it been there.
  EXPECT_STREQ(entry, "DSL_TAKE_TEST=xxx");
  EXPECT_EQ(TakeVariable("DSL_TAKE_TEST").status().code(),
            StatusCode::kInvalidArgument);
}

TEST(JoinNodeRank, FlagThenIndexedJobThenStatefulSetNameThenAny) {
  std::string said;
  EXPECT_EQ(*JoinNodeRank(5, "2", "train-worker-3", &said), 5);
  EXPECT_EQ(said, "--node_rank");
  EXPECT_EQ(*JoinNodeRank(std::nullopt, "2", "train-worker-3", &said), 2);
  EXPECT_EQ(said, "JOB_COMPLETION_INDEX");
  EXPECT_EQ(*JoinNodeRank(std::nullopt, nullptr, "train-worker-3", &said), 3);
  EXPECT_EQ(said, "the hostname train-worker-3");
  EXPECT_EQ(*JoinNodeRank(std::nullopt, "", "train-worker-12", &said), 12);
  // No trailing number: the first free node.
  for (const char* host : {"worker", "worker-", "worker-x1", "w-123456", ""})
    EXPECT_EQ(*JoinNodeRank(std::nullopt, nullptr, host, &said), -1) << host;
}

TEST(JoinNodeRank, AnIndexThatIsNoNodeRankIsAnError) {
  std::string said;
  for (const char* index : {"-1", "x", "1.5", "99999999", "70000"}) {
    auto rank = JoinNodeRank(std::nullopt, index, "w-1", &said);
    ASSERT_FALSE(rank.ok()) << index;
    EXPECT_NE(rank.status().message().find("JOB_COMPLETION_INDEX"),
              std::string::npos);
  }
}

}  // namespace
}  // namespace dslaunch::agent
