#include "launcher/supervise/agent_gate.h"

#include <gtest/gtest.h>

#include "launcher/plan/hostfile.h"

namespace dslaunch::launcher {
namespace {

const Plan kPlan = JoinPlan({"a", "b", "c"}, {1, 1, 1}, PlanOptions());

TEST(AgentGate, NoSecretIsKnownBeforeTheStart) {
  AgentGate gate("job-secret", true);
  EXPECT_FALSE(gate.NodeSecret(0).has_value());
  gate.Started(false);
  EXPECT_EQ(gate.NodeSecret(2), "job-secret");
}

TEST(AgentGate, TheJobsSecretAdmitsEachNodeAsItComesOnceThePortIsKnown) {
  AgentGate gate("s", false);
  gate.Started(false);
  JobState state(kPlan);
  ASSERT_TRUE(state.NodeAuthenticated(1).ok());
  EXPECT_TRUE(gate.Admit(1, state).empty()) << "node 0's port not known yet";
  ASSERT_TRUE(state.NodeAuthenticated(0).ok());
  gate.SetMasterPortKnown();
  EXPECT_EQ(gate.Admit(0, state), (std::vector<int>{1, 0}));
  ASSERT_TRUE(state.NodeAuthenticated(2).ok());
  EXPECT_EQ(gate.Admit(2, state), (std::vector<int>{2}));  // at once
}

TEST(AgentGate, SecretsAgentsMadeAreForOneConnectionAndOneClaim) {
  AgentGate gate("job-secret", true);
  gate.Started(true);
  EXPECT_FALSE(gate.NodeSecret(0).has_value()) << "its line has not come";
  EXPECT_EQ(gate.OnSecretLine(0, "s0", false), AgentGate::Line::kKept);
  EXPECT_EQ(gate.NodeSecret(0), "s0");
  gate.Spend(0);
  EXPECT_EQ(gate.NodeSecret(0), "") << "spent: proves nothing";
  // A line after the agent was in: ignored, nothing changes.
  EXPECT_EQ(gate.OnSecretLine(0, "forged", true), AgentGate::Line::kIgnored);
  EXPECT_EQ(gate.NodeSecret(0), "");
  // Two lines for one node before its agent came: neither holds.
  EXPECT_EQ(gate.OnSecretLine(1, "s1", false), AgentGate::Line::kKept);
  EXPECT_EQ(gate.OnSecretLine(1, "s1-again", false), AgentGate::Line::kTwice);
  EXPECT_EQ(gate.NodeSecret(1), "");
}

// Every secret is spent before any rank runs: until then one may still be
// in the start tool's pipe or buffers, within a rank's reach.
TEST(AgentGate, WhereAgentsMakeSecretsNoNodeIsAdmittedBeforeEveryAgentIsIn) {
  AgentGate gate("s", true);
  gate.Started(true);
  JobState state(kPlan);
  for (int n : {0, 1, 2})
    EXPECT_EQ(gate.OnSecretLine(n, "s", false), AgentGate::Line::kKept);
  for (int n : {2, 0}) {
    ASSERT_TRUE(state.NodeAuthenticated(n).ok());
    EXPECT_TRUE(gate.Admit(n, state).empty()) << n;
  }
  ASSERT_TRUE(state.NodeAuthenticated(1).ok());
  EXPECT_EQ(gate.Admit(1, state), (std::vector<int>{2, 0, 1}));
}

// A spare's secret is in the same pipe: the nodes wait for it too, unless
// the spare was given up on (it never came, so neither will its secret).
TEST(AgentGate, WhereAgentsMakeSecretsSparesAreWaitedForUntilGivenUpOn) {
  auto hostfile = ParseHostfile("a slots=1\nb slots=1\nc slots=1\n", "h");
  ASSERT_TRUE(hostfile.ok());
  PlanOptions options;
  options.num_nodes = 2;
  options.min_nodes = 2;  // c is a spare
  auto plan = MakePlan(*hostfile, options);
  ASSERT_TRUE(plan.ok());
  AgentGate gate("s", true);
  gate.Started(true);
  JobState state(*plan, 1);
  for (int n : {0, 1}) {
    ASSERT_TRUE(state.NodeAuthenticated(n).ok());
    EXPECT_TRUE(gate.Admit(n, state).empty()) << n;
  }
  EXPECT_TRUE(gate.Release(state).empty());
  EXPECT_EQ(state.NodeLost(2, "did not connect"), JobState::Action::kNone);
  EXPECT_EQ(gate.Release(state), (std::vector<int>{0, 1}));
}

}  // namespace
}  // namespace dslaunch::launcher
