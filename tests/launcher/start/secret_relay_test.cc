#include "launcher/start/secret_relay.h"

#include <gtest/gtest.h>

#include <map>
#include <string>
#include <vector>

#include "proto/secret_line.h"

namespace dslaunch::launcher {
namespace {

struct Recorder : Starter::Delegate {
  void OnAgentProcessExited(int, const std::string&) override {}
  void OnAgentSecret(int node_rank, std::string secret) override {
    secrets[node_rank] = std::move(secret);
  }
  void OnStarterOutput(const std::string&, std::string line) override {
    shown.push_back(std::move(line));
  }
  std::map<int, std::string> secrets;
  std::vector<std::string> shown;
};

const std::string kHex(64, 'e');

TEST(RelaySecretLine, HandsEachNodesSecretOverWhateverPrefixTheToolAdds) {
  Recorder r;
  EXPECT_TRUE(RelaySecretLine(&r, "srun", proto::SecretLine(1, kHex), 2));
  EXPECT_TRUE(RelaySecretLine(
      &r, "mpirun", "[1,2]<stdout>:" + proto::SecretLine(0, kHex), 2));
  EXPECT_EQ(r.secrets, (std::map<int, std::string>{{0, kHex}, {1, kHex}}));
  EXPECT_FALSE(RelaySecretLine(&r, "srun", "srun: error: n1: task 0: x", 2));
}

TEST(RelaySecretLine, ATaggedLineThatIsNoSecretOfOursIsDroppedNeverShown) {
  Recorder r;
  // Out of range, malformed, or (pdsh) another node's than the line's.
  EXPECT_TRUE(RelaySecretLine(&r, "srun", proto::SecretLine(2, kHex), 2));
  EXPECT_TRUE(
      RelaySecretLine(&r, "srun", "DSLAUNCH-SECRET 0 " + kHex.substr(3), 2));
  EXPECT_TRUE(RelaySecretLine(&r, "pdsh", proto::SecretLine(1, kHex), 2, 0));
  EXPECT_TRUE(RelaySecretLine(&r, "pdsh", proto::SecretLine(1, kHex), 2, -1));
  EXPECT_TRUE(r.secrets.empty());
  EXPECT_TRUE(r.shown.empty());
  EXPECT_TRUE(RelaySecretLine(&r, "pdsh", proto::SecretLine(1, kHex), 2, 1));
  EXPECT_EQ(r.secrets.at(1), kHex);
}

}  // namespace
}  // namespace dslaunch::launcher
