#include "launcher/start/start_mode.h"

#include <gtest/gtest.h>

#include <set>
#include <string>

namespace dslaunch::launcher {
namespace {

TEST(StartMode, EveryNameIsFoundAndAutoAloneMakesNoStarter) {
  const auto names = StartModeNames();
  ASSERT_FALSE(names.empty());
  EXPECT_EQ(names.front(), "auto");
  EXPECT_EQ(std::set<std::string>(names.begin(), names.end()).size(),
            names.size());
  for (const auto& name : names) {
    const StartMode* m = FindStartMode(name);
    ASSERT_NE(m, nullptr) << name;
    EXPECT_EQ(m->name, name);
    EXPECT_EQ(m->make == nullptr, name == "auto") << name;
  }
  EXPECT_EQ(FindStartMode("telnet"), nullptr);
}

TEST(StartMode, TraitsTheLauncherActsOn) {
  EXPECT_TRUE(StartModeNamed("join").agents_join);
  EXPECT_FALSE(StartModeNamed("ssh").agents_join);
  for (const char* tool : {"pdsh", "slurm", "openmpi"})
    EXPECT_TRUE(StartModeNamed(tool).tool_args) << tool;
  for (const char* none : {"local", "ssh", "join"})
    EXPECT_FALSE(StartModeNamed(none).tool_args) << none;
  // Ranks are SLURM tasks under srun, and under mpirun over an allocation.
  EXPECT_TRUE(StartModeNamed("slurm").RanksAreSlurmTasks(false));
  EXPECT_FALSE(StartModeNamed("openmpi").RanksAreSlurmTasks(false));
  EXPECT_TRUE(StartModeNamed("openmpi").RanksAreSlurmTasks(true));
  EXPECT_FALSE(StartModeNamed("ssh").RanksAreSlurmTasks(true));
  EXPECT_TRUE(StartModeNamed("slurm").scheduler_signals_agents);
  EXPECT_FALSE(StartModeNamed("openmpi").scheduler_signals_agents);
  // auto becomes slurm inside an allocation; openmpi runs over it.
  EXPECT_EQ(StartModeNamed("auto").allocation_hosts,
            AllocationHosts::kWhenInside);
  EXPECT_STREQ(StartModeNamed("auto").in_allocation_becomes, "slurm");
  EXPECT_EQ(StartModeNamed("slurm").allocation_hosts, AllocationHosts::kAlways);
  EXPECT_EQ(StartModeNamed("openmpi").in_allocation_becomes, nullptr);
  EXPECT_EQ(StartModeNamed("ssh").allocation_hosts, AllocationHosts::kNever);
}

}  // namespace
}  // namespace dslaunch::launcher
