#include "launcher/start/node_exits.h"

#include <gtest/gtest.h>

#include <string>
#include <utility>
#include <vector>

namespace dslaunch::launcher {
namespace {

struct Recorder : Starter::Delegate {
  void OnAgentProcessExited(int node, const std::string& how) override {
    ended.emplace_back(node, how);
  }
  void OnStarterOutput(const std::string&, std::string) override {}
  std::vector<std::pair<int, std::string>> ended;
};

base::ExitInfo ExitedWith(int code) {
  base::ExitInfo info;
  info.exit_code = code;
  info.wait_status = code << 8;
  return info;
}

TEST(NodeExits, ReportsEachAgentOnceAsTheToolNamesItThenTheRestWithTheTool) {
  Recorder r;
  NodeExits exits(&r, "srun");
  exits.StartedAll(100, 3);
  exits.Ended(100, 1, "Killed");
  exits.Ended(100, 1, "Killed");  // said twice: once
  exits.Ended(100, 7, "Killed");  // no such node
  exits.ToolEnded(100, ExitedWith(1));
  ASSERT_EQ(r.ended.size(), 3u);
  EXPECT_EQ(r.ended[0], std::make_pair(1, std::string("Killed")));
  EXPECT_EQ(r.ended[1].first, 0);
  EXPECT_EQ(r.ended[2].first, 2);
  EXPECT_EQ(r.ended[2].second.rfind("ended with srun, which ", 0), 0u)
      << r.ended[2].second;
  EXPECT_EQ(exits.RunOf(0), -1);
}

// A lost node's agent started again by a run of its own: that run's lines
// and end are about that node only, and the first run's about the others.
TEST(NodeExits, ARunStartedForOneNodeAnswersForThatNodeAlone) {
  Recorder r;
  NodeExits exits(&r, "pdsh");
  exits.StartedAll(100, 3);
  EXPECT_FALSE(exits.Alone(100));
  EXPECT_EQ(exits.NodeOf(100), -1);
  exits.Ended(100, 2, "exited with exit code 137");
  EXPECT_EQ(exits.RunOf(2), -1);
  exits.Started(200, {2});
  EXPECT_TRUE(exits.Alone(200));
  EXPECT_EQ(exits.NodeOf(200), 2);
  EXPECT_EQ(exits.RunOf(2), 200);
  EXPECT_EQ(exits.RunOf(0), 100);
  exits.Ended(200, 0, "exited with exit code 1");  // not this run's node
  exits.Ended(100, 2, "exited with exit code 1");  // its old agent: said
  ASSERT_EQ(r.ended.size(), 1u);
  exits.ToolEnded(200, ExitedWith(255));
  ASSERT_EQ(r.ended.size(), 2u);
  EXPECT_EQ(r.ended[1].first, 2);
  EXPECT_EQ(exits.RunOf(0), 100);  // the first run goes on
  exits.ToolEnded(100, ExitedWith(0));
  ASSERT_EQ(r.ended.size(), 4u);
  EXPECT_EQ(r.ended[2].first, 0);
  EXPECT_EQ(r.ended[3].first, 1);
}

}  // namespace
}  // namespace dslaunch::launcher
