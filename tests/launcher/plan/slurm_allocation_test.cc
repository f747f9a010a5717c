#include "launcher/plan/slurm_allocation.h"

#include <gtest/gtest.h>

#include <map>
#include <string>
#include <vector>

#include "tests/launcher/plan/fake_env.h"

namespace dslaunch::launcher {
namespace {

TEST(TasksPerNode, ExpandsRepeatsInNodeOrder) {
  auto counts = ParseTasksPerNode("4(x2),2", 3);
  ASSERT_TRUE(counts.ok()) << counts.status().message();
  EXPECT_EQ(*counts, (std::vector<int>{4, 4, 2}));
  EXPECT_EQ(*ParseTasksPerNode("1", 1), (std::vector<int>{1}));
  EXPECT_EQ(*ParseTasksPerNode("2(x3)", 3), (std::vector<int>{2, 2, 2}));
}

TEST(TasksPerNode, MalformedOrMismatchedIsADataErrorNamingTheVariable) {
  for (const char* bad :
       {"", "x", "4(x2", "4(x)", "4(x0)", "0", "-1", "4,", "4(y2)", "99999"}) {
    auto counts = ParseTasksPerNode(bad, 2);
    ASSERT_FALSE(counts.ok()) << bad;
    EXPECT_EQ(counts.status().code(), StatusCode::kDataError);
    EXPECT_EQ(counts.status().message().rfind("SLURM_TASKS_PER_NODE '", 0), 0u)
        << counts.status().message();
  }
  EXPECT_NE(ParseTasksPerNode("2(x3)", 2)
                .status()
                .message()
                .find("more entries than the 2 nodes"),
            std::string::npos);
  EXPECT_NE(ParseTasksPerNode("2", 2).status().message().find(
                "1 entries for the 2 nodes"),
            std::string::npos);
}

TEST(SlurmAllocation, NodesFromTheNodeListSlotsByPrecedence) {
  std::map<std::string, std::string> vars = {
      {"SLURM_JOB_ID", "77"},
      {"SLURM_JOB_NODELIST", "gpu-a[01-02],gpu-b7"},
      {"SLURM_TASKS_PER_NODE", "4(x2),2"},
  };
  auto a = ReadSlurmAllocation(FakeEnv(vars), -1);
  ASSERT_TRUE(a.ok()) << a.status().message();
  EXPECT_EQ(a->job_id, "77");
  EXPECT_EQ(a->nodes,
            (std::vector<std::string>{"gpu-a01", "gpu-a02", "gpu-b7"}));
  EXPECT_EQ(a->slots, (std::vector<int>{4, 4, 2}));
  EXPECT_EQ(DescribeAllocation(*a),
            "SLURM job 77: 3 nodes from SLURM_JOB_NODELIST, ranks 4,4,2 from "
            "SLURM_TASKS_PER_NODE");
  vars["SLURM_GPUS_ON_NODE"] = "8";
  a = ReadSlurmAllocation(FakeEnv(vars), -1);
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(a->slots, (std::vector<int>{8, 8, 8}));
  EXPECT_EQ(a->slots_from, "SLURM_GPUS_ON_NODE");
  a = ReadSlurmAllocation(FakeEnv(vars), 2);
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(a->slots, (std::vector<int>{2, 2, 2}));
  EXPECT_EQ(DescribeAllocation(*a),
            "SLURM job 77: 3 nodes from SLURM_JOB_NODELIST, ranks 2 per node "
            "from --num_gpus");
  vars.erase("SLURM_GPUS_ON_NODE");
  vars.erase("SLURM_TASKS_PER_NODE");
  a = ReadSlurmAllocation(FakeEnv(vars), -1);
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(a->slots, (std::vector<int>{1, 1, 1}));
  EXPECT_EQ(DescribeAllocation(*a),
            "SLURM job 77: 3 nodes from SLURM_JOB_NODELIST, ranks 1 per node "
            "(no --num_gpus, SLURM_GPUS_ON_NODE or SLURM_TASKS_PER_NODE)");
}

TEST(SlurmAllocation, OutsideOrMalformedSaysWhich) {
  EXPECT_FALSE(InSlurmAllocation(FakeEnv({})));
  EXPECT_TRUE(InSlurmAllocation(
      FakeEnv({{"SLURM_JOB_ID", "1"}, {"SLURM_NODELIST", "n1"}})));
  EXPECT_EQ(ReadSlurmAllocation(FakeEnv({}), -1).status().code(),
            StatusCode::kNotFound);
  auto a = ReadSlurmAllocation(
      FakeEnv({{"SLURM_JOB_ID", "1"}, {"SLURM_JOB_NODELIST", "n[1-"}}), -1);
  EXPECT_EQ(a.status().message(),
            "SLURM_JOB_NODELIST: malformed range 'n[1-': missing ']'");
  a = ReadSlurmAllocation(FakeEnv({{"SLURM_JOB_ID", "1"},
                                   {"SLURM_JOB_NODELIST", "n1"},
                                   {"SLURM_GPUS_ON_NODE", "many"}}),
                          -1);
  EXPECT_NE(a.status().message().find("SLURM_GPUS_ON_NODE 'many'"),
            std::string::npos);
}

TEST(SlurmAllocation, BecomesAHostfileThatFiltersApplyTo) {
  SlurmAllocation a{"5", {"n1", "n2"}, {2, 3}, "x"};
  Hostfile h = AllocationHostfile(a);
  ASSERT_EQ(h.hosts.size(), 2u);
  EXPECT_EQ(h.hosts[1].host, "n2");
  EXPECT_EQ(h.hosts[1].slots, 3);
  EXPECT_EQ(h.path, "SLURM_JOB_NODELIST");
}

}  // namespace
}  // namespace dslaunch::launcher
