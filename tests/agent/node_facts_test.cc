#include "agent/node_facts.h"

#include <gtest/gtest.h>

namespace dslaunch::agent {
namespace {

TEST(InterfaceToward, LoopbackForThisMachineAndNothingForTheUnknown) {
  EXPECT_EQ(InterfaceToward("127.0.0.1"), "lo");
  EXPECT_EQ(InterfaceToward("localhost").empty(), false);
  EXPECT_EQ(InterfaceToward(""), "");
  EXPECT_EQ(InterfaceToward("no-such-host.invalid"), "");
}

TEST(CollectNodeFacts, NamesTheHostAndItsCores) {
  const wire::NodeFacts facts = CollectNodeFacts();
  EXPECT_FALSE(facts.hostname().empty());
  EXPECT_GT(facts.cpu_cores(), 0);
  EXPECT_GT(facts.agent_pid(), 0);
}

}  // namespace
}  // namespace dslaunch::agent
