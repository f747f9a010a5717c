#include "launcher/flags.h"

#include <gtest/gtest.h>

#include <vector>

namespace dslaunch::launcher {
namespace {

StatusOr<LaunchOptions> Parse(std::vector<const char*> args, int* exit_now) {
  args.insert(args.begin(), "dslaunch");
  return ParseFlags(static_cast<int>(args.size()), args.data(), exit_now);
}

TEST(Flags, ProgramAndItsArgumentsArePassedUntouched) {
  int exit_now;
  auto o = Parse({"-H", "h.txt", "--num_nodes", "2", "python", "train.py",
                  "--hostfile", "x", "--deepspeed", "$(rm -rf /)"},
                 &exit_now);
  ASSERT_TRUE(o.ok()) << o.status().message();
  EXPECT_EQ(exit_now, -1);
  EXPECT_TRUE(o->hostfile_given);
  EXPECT_EQ(o->hostfile, "h.txt");
  EXPECT_EQ(o->plan.num_nodes, 2);
  EXPECT_EQ(o->program,
            (std::vector<std::string>{"python", "train.py", "--hostfile", "x",
                                      "--deepspeed", "$(rm -rf /)"}));
}

TEST(Flags, DoubleDashSeparatesTheProgram) {
  int exit_now;
  auto o = Parse({"--no_local_rank", "--", "prog", "-i"}, &exit_now);
  ASSERT_TRUE(o.ok()) << o.status().message();
  EXPECT_TRUE(o->no_local_rank);
  EXPECT_EQ(o->program, (std::vector<std::string>{"prog", "-i"}));
}

TEST(Flags, DeepSpeedNamesAreAccepted) {
  int exit_now;
  auto o = Parse({"-i", "a:0,1@b", "--num_gpus", "2", "--master_addr", "a",
                  "--master_port", "1234", "--kill_grace", "2", "--env", "A=1",
                  "--env", "B=2", "--log_dir", "/tmp/x", "--dry-run", "p"},
                 &exit_now);
  ASSERT_TRUE(o.ok()) << o.status().message();
  EXPECT_EQ(o->plan.include, "a:0,1@b");
  EXPECT_EQ(o->plan.num_gpus, 2);
  EXPECT_EQ(o->plan.master_port, 1234);
  EXPECT_EQ(o->kill_grace_s, 2);
  EXPECT_EQ(o->env, (std::vector<std::string>{"A=1", "B=2"}));
  EXPECT_TRUE(o->dry_run);
}

TEST(Flags, MissingProgramIsUsageError) {
  int exit_now;
  auto o = Parse({"-H", "h.txt"}, &exit_now);
  ASSERT_FALSE(o.ok());
  EXPECT_EQ(o.status().code(), StatusCode::kInvalidArgument);
}

TEST(Flags, EnvWithoutEqualsIsRejected) {
  int exit_now;
  auto o = Parse({"--env", "NOEQUALS", "p"}, &exit_now);
  ASSERT_FALSE(o.ok());
  EXPECT_NE(o.status().message().find("--env 'NOEQUALS'"), std::string::npos);
}

TEST(Flags, UnknownLauncherModeIsRejected) {
  int exit_now;
  auto o = Parse({"--launcher", "telnet", "p"}, &exit_now);
  EXPECT_FALSE(o.ok());
}

TEST(Flags, NoHostfileMeansThisMachine) {
  LaunchOptions o;
  auto h = LoadJobHostfile(o);
  ASSERT_TRUE(h.ok());
  ASSERT_EQ(h->hosts.size(), 1u);
  EXPECT_EQ(h->hosts[0].host, "localhost");
  EXPECT_GE(h->hosts[0].slots, 1);
}

TEST(Flags, NamedHostfileThatIsMissingIsAnError) {
  LaunchOptions o;
  o.hostfile = "/nonexistent/hosts";
  o.hostfile_given = true;
  auto h = LoadJobHostfile(o);
  ASSERT_FALSE(h.ok());
  EXPECT_EQ(h.status().code(), StatusCode::kDataError);
}

}  // namespace
}  // namespace dslaunch::launcher
