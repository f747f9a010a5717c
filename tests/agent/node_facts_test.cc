#include "agent/node_facts.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include "base/process_tree.h"

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
  // What a kill by pid checks: this very process.
  EXPECT_EQ(facts.agent_start_ticks(), base::ProcessStartTicks(::getpid()));
  EXPECT_GT(facts.agent_start_ticks(), 0u);
}

}  // namespace
}  // namespace dslaunch::agent
