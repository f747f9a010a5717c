#include "proto/auth.h"

#include <gtest/gtest.h>
#include <openssl/evp.h>   // EVP_sha256, the reference
#include <openssl/hmac.h>  // HMAC, the reference
#include <sys/stat.h>      // mkfifo
#include <unistd.h>        // chown

#include <filesystem>
#include <fstream>
#include <set>
#include <string>
#include <vector>

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

TEST(Auth, HmacSha256MatchesRfc4231TestCases1And6) {
  EXPECT_EQ(HexEncode(HmacSha256(std::string(20, '\x0b'), "Hi There")),
            "b0344c61d8db38535ca8afceaf0bf12b881dc200c9833da726e9376c2e32cff7");
  // A key longer than SHA-256's block is hashed first.
  EXPECT_EQ(
      HexEncode(HmacSha256(std::string(131, '\xaa'),
                           "Test Using Larger Than Block-Size Key - Hash Key "
                           "First")),
      "60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54");
}

TEST(Auth, HmacSha256EqualsOpenSslsHmacForEveryKeyLength) {
  const std::string data = RandomBytes(200);
  for (size_t key_len = 0; key_len <= 130; ++key_len) {
    const std::string key = RandomBytes(key_len);
    for (size_t data_len : {size_t{0}, size_t{1}, size_t{55}, size_t{64},
                            size_t{65}, size_t{200}}) {
      unsigned char md[EVP_MAX_MD_SIZE];
      unsigned int md_len = 0;
      ASSERT_NE(HMAC(EVP_sha256(), key.data(), static_cast<int>(key.size()),
                     reinterpret_cast<const unsigned char*>(data.data()),
                     data_len, md, &md_len),
                nullptr);
      EXPECT_EQ(HmacSha256(key, std::string_view(data).substr(0, data_len)),
                std::string(reinterpret_cast<char*>(md), md_len))
          << "key " << key_len << " data " << data_len;
    }
  }
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
  // More than one getrandom call may return.
  const std::string many = RandomBytes(100000);
  EXPECT_EQ(many.size(), 100000u);
  EXPECT_NE(many.find_first_not_of('\0'), std::string::npos);
}

TEST(Auth, ReadSecretFileTakesOneLineAndRefusesWeakOrOddSecrets) {
  char dir_template[] = "/tmp/dsl-secret-test-XXXXXX";
  ASSERT_NE(::mkdtemp(dir_template), nullptr);
  const std::string dir = dir_template;
  auto write = [&](const std::string& name, const std::string& text) {
    std::ofstream(dir + "/" + name) << text;
    return dir + "/" + name;
  };
  const std::string hex(64, 'a');
  auto ok = ReadSecretFile(write("ok", hex + "\n"));
  ASSERT_TRUE(ok.ok()) << ok.status().message();
  EXPECT_EQ(*ok, hex);
  EXPECT_EQ(*ReadSecretFile(write("bare", hex)), hex);
  const std::vector<std::pair<std::string, std::string>> bad = {
      {"", "empty"},
      {"\n", "empty"},
      {"short\n", "shorter than 32"},
      {hex + " " + hex, "space or control"},
      {hex + "\n" + hex, "space or control"},
      {std::string(5000, 'a'), "longer than 4096"},
  };
  int i = 0;
  for (const auto& [text, want] : bad) {
    const std::string path = write("bad" + std::to_string(i++), text);
    auto st = ReadSecretFile(path);
    ASSERT_FALSE(st.ok()) << want;
    EXPECT_NE(st.status().message().find(path), std::string::npos);
    EXPECT_NE(st.status().message().find(want), std::string::npos)
        << st.status().message();
  }
  auto not_file = ReadSecretFile(dir);
  ASSERT_FALSE(not_file.ok());
  EXPECT_NE(not_file.status().message().find("not a regular file"),
            std::string::npos);
  ASSERT_EQ(::mkfifo((dir + "/fifo").c_str(), 0600), 0);
  EXPECT_FALSE(ReadSecretFile(dir + "/fifo").ok());  // and does not hang
  auto missing = ReadSecretFile(dir + "/none");
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find(dir + "/none"), std::string::npos);
  std::filesystem::remove_all(dir);
}

TEST(Auth, SecretFileWarningsNameAWorldReadableFileAndAGuessableSecret) {
  char dir_template[] = "/tmp/dsl-secret-warn-XXXXXX";
  ASSERT_NE(::mkdtemp(dir_template), nullptr);
  const std::string dir = dir_template;
  const std::string path = dir + "/secret";
  const std::string good =
      "3f9a1c0e7b5d2846f1e0a9c3b7d5e2f4a6c8e0b2d4f6a8c0e2b4d6f8a0c2e4b6";
  std::ofstream(path) << good << "\n";
  ASSERT_EQ(::chmod(path.c_str(), 0440), 0);  // group: the pod's fsGroup
  EXPECT_TRUE(SecretFileWarnings(path, good).empty());
  // Random hex of the shortest length taken (16 bytes) passes too.
  EXPECT_TRUE(
      SecretFileWarnings(path, "9c1e5a7f3b2d8e40a6c4f2e1d9b7053a").empty());
  ASSERT_EQ(::chmod(path.c_str(), 0644), 0);
  auto readable = SecretFileWarnings(path, good);
  ASSERT_EQ(readable.size(), 1u);
  EXPECT_NE(readable[0].find(path + " is readable by every user"),
            std::string::npos)
      << readable[0];
  EXPECT_NE(readable[0].find("0644"), std::string::npos) << readable[0];
  ASSERT_EQ(::chmod(path.c_str(), 0400), 0);
  for (const std::string& weak :
       {std::string(32, 'a'), std::string("abababababababababababababababab"),
        std::string("passwordpasswordpasswordpassword"),
        std::string("0123012301230123012301230123012301230123"),
        std::string("0123456789abcdef0123456789abcdef"),
        std::string("abcdefghijklmnopqrstuvwxyz012345")}) {
    auto w = SecretFileWarnings(path, weak);
    ASSERT_EQ(w.size(), 1u) << weak;
    EXPECT_NE(w[0].find(path + ": the secret looks guessable"),
              std::string::npos)
        << w[0];
  }
  // Another user's file: they can read it and change it.
  ASSERT_EQ(::chown(path.c_str(), 65534, 65534), 0);
  auto foreign = SecretFileWarnings(path, good);
  ASSERT_EQ(foreign.size(), 1u);
  EXPECT_NE(foreign[0].find(path + " belongs to user 65534"), std::string::npos)
      << foreign[0];
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace dslaunch::proto
