#include "proto/secret_line.h"

#include <gtest/gtest.h>

#include <string>

namespace dslaunch::proto {
namespace {

const std::string kHex(64, 'a');

TEST(SecretLine, ReadsBackTheNodeAndTheSecretItWrote) {
  const std::string hex = "0123456789abcdef" + std::string(48, 'f');
  const std::string line = SecretLine(12, hex);
  EXPECT_EQ(line, "DSLAUNCH-SECRET 12 " + hex);
  auto parsed = ParseSecretLine(line);
  ASSERT_TRUE(parsed.ok()) << parsed.status().message();
  EXPECT_EQ(parsed->node_rank, 12);
  EXPECT_EQ(parsed->secret, hex);
}

TEST(SecretLine, FindsTheTagAfterAPrefixTheToolAdds) {
  for (const std::string prefix : {"0: ", "[1,0]<stdout>:", "n1: "}) {
    auto parsed = ParseSecretLine(prefix + SecretLine(3, kHex) + "\r");
    ASSERT_TRUE(parsed.ok()) << prefix;
    EXPECT_EQ(parsed->node_rank, 3);
    EXPECT_EQ(parsed->secret, kHex);
    EXPECT_TRUE(HasSecretTag(prefix + SecretLine(3, kHex)));
  }
  EXPECT_FALSE(HasSecretTag("mpi rank 0 of 3"));
}

TEST(SecretLine, RefusesAnythingElseWithoutQuotingIt) {
  for (const std::string& line :
       {"DSLAUNCH-SECRET " + kHex, "DSLAUNCH-SECRET x " + kHex,
        "DSLAUNCH-SECRET -1 " + kHex, "DSLAUNCH-SECRET 65536 " + kHex,
        "DSLAUNCH-SECRET 1 " + kHex.substr(1),
        "DSLAUNCH-SECRET 1 " + kHex + "a",
        "DSLAUNCH-SECRET 1 " + std::string(64, 'A'),
        "DSLAUNCH-SECRET 1  " + kHex, "no tag 1 " + kHex}) {
    auto parsed = ParseSecretLine(line);
    ASSERT_FALSE(parsed.ok()) << line;
    EXPECT_EQ(parsed.status().code(), StatusCode::kInvalidArgument);
    EXPECT_EQ(parsed.status().message().find("aaaa"), std::string::npos);
  }
}

}  // namespace
}  // namespace dslaunch::proto
