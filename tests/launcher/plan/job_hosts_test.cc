#include "launcher/plan/job_hosts.h"

#include <gtest/gtest.h>

#include <map>
#include <string>

#include "tests/launcher/plan/fake_env.h"

namespace dslaunch::launcher {
namespace {

const std::map<std::string, std::string> kInside = {
    {"SLURM_JOB_ID", "77"},
    {"SLURM_JOB_NODELIST", "gpu[01-02]"},
    {"SLURM_TASKS_PER_NODE", "2(x2)"},
};

TEST(JobHosts, OutsideAnAllocationIsThisMachine) {
  for (auto where : {AllocationHosts::kNever, AllocationHosts::kWhenInside}) {
    auto h = LoadJobHosts({"", 3, where, "auto"}, FakeEnv({}));
    ASSERT_TRUE(h.ok()) << h.status().message();
    EXPECT_FALSE(h->from_allocation);
    ASSERT_EQ(h->hostfile.hosts.size(), 1u);
    EXPECT_EQ(h->hostfile.hosts[0].host, "localhost");
    EXPECT_EQ(h->hostfile.hosts[0].slots, 3);
    EXPECT_EQ(h->said, "");
  }
}

TEST(JobHosts, InsideAnAllocationTheModesThatTakeOneRunOverIt) {
  for (auto where : {AllocationHosts::kWhenInside, AllocationHosts::kAlways}) {
    auto h = LoadJobHosts({"", 0, where, "slurm"}, FakeEnv(kInside));
    ASSERT_TRUE(h.ok()) << h.status().message();
    EXPECT_TRUE(h->from_allocation);
    ASSERT_EQ(h->hostfile.hosts.size(), 2u);
    EXPECT_EQ(h->hostfile.hosts[1].host, "gpu02");
    EXPECT_EQ(h->hostfile.hosts[1].slots, 2);
    EXPECT_NE(h->said.find("SLURM job 77"), std::string::npos) << h->said;
  }
  // ssh, pdsh, local: this machine even inside one.
  auto h =
      LoadJobHosts({"", 0, AllocationHosts::kNever, "ssh"}, FakeEnv(kInside));
  ASSERT_TRUE(h.ok());
  EXPECT_FALSE(h->from_allocation);
  EXPECT_EQ(h->hostfile.hosts[0].host, "localhost");
}

TEST(JobHosts, AGivenHostfileWinsOverTheAllocation) {
  auto h =
      LoadJobHosts({"/nonexistent/hosts", 0, AllocationHosts::kAlways, "slurm"},
                   FakeEnv(kInside));
  ASSERT_FALSE(h.ok());  // read (and missing), never replaced
  EXPECT_EQ(h.status().code(), StatusCode::kDataError);
}

TEST(JobHosts, AModeThatNeedsAnAllocationSaysSoOutsideOne) {
  auto h =
      LoadJobHosts({"", 0, AllocationHosts::kAlways, "slurm"}, FakeEnv({}));
  ASSERT_FALSE(h.ok());
  EXPECT_EQ(h.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(h.status().message().rfind("--launcher slurm: ", 0), 0u)
      << h.status().message();
}

}  // namespace
}  // namespace dslaunch::launcher
