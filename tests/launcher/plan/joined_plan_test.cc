#include "launcher/plan/joined_plan.h"

#include <gtest/gtest.h>

#include "launcher/plan/hostfile.h"  // kMaxSlotsPerHost

namespace dslaunch::launcher {
namespace {

TEST(JoinedPlan, NodesInRankOrderWithTheirGpusAndNode0sAddressAndPort) {
  std::map<int, JoinedAgent> joined = {
      {1, {"worker-1", 0, 0, "10.9.0.12"}},
      {0, {"worker-0", 3, 40123, "10.9.0.11"}},
  };
  auto p = PlanFromJoinedAgents(joined, PlanOptions(), false,
                                static_cast<int>(joined.size()));
  ASSERT_TRUE(p.ok()) << p.status().message();
  ASSERT_EQ(p->plan.nodes.size(), 2u);
  EXPECT_EQ(p->plan.nodes[0].host, "worker-0");
  EXPECT_EQ(p->plan.nodes[0].slots.size(), 3u);
  EXPECT_EQ(p->plan.nodes[1].host, "worker-1");
  EXPECT_EQ(p->plan.nodes[1].slots.size(), 1u);  // no GPU: one rank
  EXPECT_EQ(p->plan.nodes[1].first_rank, 3);
  EXPECT_EQ(p->plan.world_size, 4);
  EXPECT_EQ(p->plan.master_addr, "10.9.0.11");
  EXPECT_EQ(p->plan.master_port, 40123);
  EXPECT_EQ(p->warning, "");
}

TEST(JoinedPlan, GivenFlagsWin) {
  std::map<int, JoinedAgent> joined = {{0, {"", 8, 40123, "10.9.0.11"}}};
  PlanOptions o;
  o.num_gpus = 2;
  o.master_addr = "train-0.svc";
  o.master_port = 29501;
  auto p =
      PlanFromJoinedAgents(joined, o, true, static_cast<int>(joined.size()));
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(p->plan.nodes[0].host, "10.9.0.11");  // no hostname: the address
  EXPECT_EQ(p->plan.world_size, 2);
  EXPECT_EQ(p->plan.master_addr, "train-0.svc");
  EXPECT_EQ(p->plan.master_port, 29501);
}

TEST(JoinedPlan, Node0OverLoopbackWithRemoteNodesIsWarnedOf) {
  std::map<int, JoinedAgent> joined = {{0, {"a", 0, 0, "127.0.0.1"}},
                                       {1, {"b", 0, 0, "10.9.0.12"}}};
  auto p = PlanFromJoinedAgents(joined, PlanOptions(), false,
                                static_cast<int>(joined.size()));
  ASSERT_TRUE(p.ok());
  EXPECT_NE(p->warning.find("joined over loopback"), std::string::npos);
  joined[1].addr = "127.0.0.1";  // all here: nothing to warn of
  p = PlanFromJoinedAgents(joined, PlanOptions(), false,
                           static_cast<int>(joined.size()));
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(p->warning, "");
}

TEST(JoinedPlan, ClaimsNobodyTookAreSparesAndTheJoinedAreRenumbered) {
  std::map<int, JoinedAgent> joined = {{1, {"w1", 2, 40001, "10.9.0.12"}},
                                       {3, {"w3", 2, 0, "10.9.0.14"}}};
  PlanOptions o;
  o.min_nodes = 2;
  auto p = PlanFromJoinedAgents(joined, o, false, 4);
  ASSERT_TRUE(p.ok()) << p.status().message();
  ASSERT_EQ(p->plan.nodes.size(), 2u);
  EXPECT_EQ(p->plan.nodes[0].agent, 1);
  EXPECT_EQ(p->plan.nodes[0].node_rank, 0);
  EXPECT_EQ(p->plan.nodes[1].agent, 3);
  EXPECT_EQ(p->plan.nodes[1].first_rank, 2);
  EXPECT_EQ(p->plan.min_nodes, 2);
  EXPECT_EQ(p->plan.master_addr, "10.9.0.12");  // the lowest claim's
  EXPECT_EQ(p->plan.master_port, 40001);
  ASSERT_EQ(p->plan.spares.size(), 2u);
  EXPECT_EQ(p->plan.spares[0].agent, 0);
  EXPECT_EQ(p->plan.spares[0].host, "join-0");
  EXPECT_EQ(p->plan.spares[1].agent, 2);
  const Plan pool = AgentPool(p->plan);
  ASSERT_EQ(pool.nodes.size(), 4u);
  EXPECT_EQ(pool.nodes[1].host, "w1");
  EXPECT_EQ(pool.nodes[2].host, "join-2");
  EXPECT_EQ(pool.nodes[3].host, "w3");
}

TEST(JoinedPlan, HostileHostnamesAreEscapedAndTooManyGpusRefused) {
  std::map<int, JoinedAgent> joined = {
      {0, {"evil\x1b]0;pwned\x07\nname", kMaxSlotsPerHost + 1, 0, "10.0.0.1"}}};
  auto p = PlanFromJoinedAgents(joined, PlanOptions(), false,
                                static_cast<int>(joined.size()));
  ASSERT_FALSE(p.ok());
  EXPECT_EQ(p.status().code(), StatusCode::kInvalidArgument);
  const std::string& m = p.status().message();
  EXPECT_EQ(m.find('\x1b'), std::string::npos) << m;
  EXPECT_EQ(m.find('\n'), std::string::npos) << m;
  EXPECT_NE(m.find("--num_gpus sets it"), std::string::npos) << m;
  joined[0].gpus = 1;
  p = PlanFromJoinedAgents(joined, PlanOptions(), false,
                           static_cast<int>(joined.size()));
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(p->plan.nodes[0].host.find('\x1b'), std::string::npos);
}

}  // namespace
}  // namespace dslaunch::launcher
