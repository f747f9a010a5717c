#include "proto/auth.h"

#include <gtest/gtest.h>

#include <set>
#include <string>

namespace dslaunch::proto {
namespace {

const std::string kSecret(kSecretBytes, 's');
const std::string kClientNonce(kNonceBytes, 'c');
const std::string kServerNonce(kNonceBytes, 'n');

TEST(Auth, LauncherProofIsTheSameForTheSameSecretAndNonces) {
  EXPECT_EQ(LauncherProof(kSecret, kClientNonce, kServerNonce),
            LauncherProof(std::string(kSecret), kClientNonce, kServerNonce));
  EXPECT_EQ(AgentProof(kSecret, kClientNonce, kServerNonce),
            AgentProof(kSecret, std::string(kClientNonce), kServerNonce));
}

TEST(Auth, ProofsAreSha256Sized) {
  EXPECT_EQ(LauncherProof(kSecret, kClientNonce, kServerNonce).size(), 32u);
  EXPECT_EQ(AgentProof(kSecret, kClientNonce, kServerNonce).size(), 32u);
}

TEST(Auth, ProofsDifferForAnotherSecret) {
  std::string other = kSecret;
  other.back() ^= 1;
  EXPECT_NE(LauncherProof(kSecret, kClientNonce, kServerNonce),
            LauncherProof(other, kClientNonce, kServerNonce));
  EXPECT_NE(AgentProof(kSecret, kClientNonce, kServerNonce),
            AgentProof(other, kClientNonce, kServerNonce));
}

TEST(Auth, ProofsDifferForOtherNonces) {
  const std::string proof = LauncherProof(kSecret, kClientNonce, kServerNonce);
  EXPECT_NE(proof, LauncherProof(kSecret, kServerNonce, kServerNonce));
  EXPECT_NE(proof, LauncherProof(kSecret, kClientNonce, kClientNonce));
  // Swapping the nonces is not the same proof either.
  EXPECT_NE(proof, LauncherProof(kSecret, kServerNonce, kClientNonce));
}

TEST(Auth, LauncherProofCannotBeReplayedAsAgentProof) {
  EXPECT_NE(LauncherProof(kSecret, kClientNonce, kServerNonce),
            AgentProof(kSecret, kClientNonce, kServerNonce));
  // Not even with the nonces in the other order.
  EXPECT_NE(LauncherProof(kSecret, kClientNonce, kServerNonce),
            AgentProof(kSecret, kServerNonce, kClientNonce));
}

TEST(Auth, HmacSha256MatchesRfc4231TestCase2) {
  EXPECT_EQ(HexEncode(HmacSha256("Jefe", "what do ya want for nothing?")),
            "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843");
}

TEST(Auth, HexEncodeWritesLowercasePairs) {
  EXPECT_EQ(HexEncode(""), "");
  EXPECT_EQ(HexEncode(std::string("\x00\x01\x7f\x80\xab\xff", 6)),
            "00017f80abff");
  EXPECT_EQ(HexEncode("AZ"), "415a");
}

TEST(Auth, ConstantTimeEqualComparesContentAndLength) {
  EXPECT_TRUE(ConstantTimeEqual("", ""));
  EXPECT_TRUE(ConstantTimeEqual("abc", "abc"));
  EXPECT_TRUE(
      ConstantTimeEqual(std::string("a\0b", 3), std::string("a\0b", 3)));
  EXPECT_FALSE(ConstantTimeEqual("abc", "abd"));
  EXPECT_FALSE(ConstantTimeEqual("abc", "ab"));
  EXPECT_FALSE(ConstantTimeEqual("ab", "abc"));
  EXPECT_FALSE(
      ConstantTimeEqual(std::string("a\0b", 3), std::string("a\0c", 3)));
}

TEST(Auth, RandomBytesHaveTheRequestedSizeAndDiffer) {
  std::set<std::string> seen;
  for (int i = 0; i < 16; ++i) {
    const std::string bytes = RandomBytes(kNonceBytes);
    EXPECT_EQ(bytes.size(), kNonceBytes);
    seen.insert(bytes);
  }
  EXPECT_EQ(seen.size(), 16u);
  EXPECT_EQ(RandomBytes(0), "");
}

}  // namespace
}  // namespace dslaunch::proto
