#include "launcher/plan/job_spec.h"

#include <gtest/gtest.h>

namespace dslaunch::launcher {
namespace {

TEST(JobSpec, EachNodeGetsItsRanksAndWhatEveryNodeShares) {
  const Plan plan = JoinPlan({"a", "b"}, {2, 3}, PlanOptions());
  JobSpecParts parts;
  parts.job_id = "j1";
  parts.env = {{"K", "v"}};
  parts.command = {{"python", "-u", "train.py"}, 3};
  parts.cwd = "/work";
  parts.kill_grace_s = 7;
  parts.bind_cores = {0, 2};
  parts.slurm_task_env = true;
  const wire::JobSpec spec = MakeJobSpec(plan, parts, 1);
  EXPECT_EQ(spec.job_id(), "j1");
  ASSERT_EQ(spec.argv_size(), 3);
  EXPECT_EQ(spec.argv(2), "train.py");
  ASSERT_EQ(spec.env_size(), 1);
  EXPECT_EQ(spec.env(0).key(), "K");
  EXPECT_EQ(spec.cwd(), "/work");
  EXPECT_EQ(spec.node_rank(), 1);
  EXPECT_EQ(spec.num_nodes(), 2);
  EXPECT_EQ(spec.world_size(), 5);
  ASSERT_EQ(spec.ranks_size(), 3);
  EXPECT_EQ(spec.ranks(0).rank(), 2);
  EXPECT_EQ(spec.ranks(2).rank(), 4);
  EXPECT_EQ(spec.ranks(2).local_rank(), 2);
  EXPECT_EQ(spec.visible_slots_size(), 3);
  EXPECT_TRUE(spec.append_local_rank());
  EXPECT_EQ(spec.local_rank_at(), 3);
  EXPECT_EQ(spec.kill_grace_s(), 7);
  EXPECT_EQ(spec.bind_core_list_size(), 2);
  EXPECT_TRUE(spec.slurm_task_env());
  EXPECT_EQ(spec.host(), "b");
  // --no_local_rank: nothing appended.
  parts.command.local_rank_at = -1;
  EXPECT_FALSE(MakeJobSpec(plan, parts, 0).append_local_rank());
  EXPECT_EQ(MakeJobSpec(plan, parts, 0).local_rank_at(), 0);
}

}  // namespace
}  // namespace dslaunch::launcher
