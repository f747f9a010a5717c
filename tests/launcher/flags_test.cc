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

// Returns the usage error of parsing `args`, failing if they parse.
std::string UsageError(std::vector<const char*> args) {
  int exit_now;
  auto o = Parse(std::move(args), &exit_now);
  EXPECT_FALSE(o.ok()) << "parsed unexpectedly";
  if (o.ok()) return "";
  EXPECT_EQ(o.status().code(), StatusCode::kInvalidArgument);
  return o.status().message();
}

TEST(Flags, RejectsNanInfNegativeAndHugeSecondsNamingTheFlag) {
  EXPECT_EQ(UsageError({"--kill_grace", "nan", "p"}),
            "--kill_grace must be a number of seconds in [0, 3600], got nan");
  EXPECT_EQ(UsageError({"--kill_grace", "-1", "p"}),
            "--kill_grace must be a number of seconds in [0, 3600], got -1");
  EXPECT_EQ(UsageError({"--kill_grace", "inf", "p"}),
            "--kill_grace must be a number of seconds in [0, 3600], got inf");
  EXPECT_EQ(UsageError({"--heartbeat_interval", "nan", "p"}),
            "--heartbeat_interval must be a number of seconds in [0.01, "
            "3600], got nan");
  EXPECT_EQ(UsageError({"--heartbeat_interval", "0.000001", "p"}),
            "--heartbeat_interval must be a number of seconds in [0.01, "
            "3600], got 1e-06");
  EXPECT_EQ(UsageError({"--heartbeat_timeout", "inf", "p"}),
            "--heartbeat_timeout must be a number of seconds in (0, 3600], "
            "got inf");
  EXPECT_EQ(UsageError({"--start_timeout", "-inf", "p"}),
            "--start_timeout must be a number of seconds in (0, 86400], got "
            "-inf");
  EXPECT_EQ(UsageError({"--start_timeout", "0", "p"}),
            "--start_timeout must be a number of seconds in (0, 86400], got 0");
  EXPECT_EQ(UsageError({"--ssh_timeout", "1e300", "p"}),
            "--ssh_timeout must be a number of seconds in (0, 3600], got "
            "1e+300");
  EXPECT_EQ(UsageError(
                {"--heartbeat_interval", "5", "--heartbeat_timeout", "5", "p"}),
            "--heartbeat_timeout must be greater than --heartbeat_interval, "
            "got 5 <= 5");
}

TEST(Flags, AcceptsSecondsAtTheBounds) {
  int exit_now;
  auto o = Parse({"--kill_grace", "0", "--heartbeat_interval", "0.01",
                  "--heartbeat_timeout", "3600", "--start_timeout", "86400",
                  "--ssh_timeout", "0.5", "p"},
                 &exit_now);
  ASSERT_TRUE(o.ok()) << o.status().message();
  EXPECT_EQ(o->kill_grace_s, 0);
  EXPECT_EQ(o->ssh_timeout_s, 0.5);
}

TEST(Flags, GivenIntegersOutsideTheirRangeAreUsageErrors) {
  EXPECT_EQ(UsageError({"--num_nodes", "0", "p"}),
            "--num_nodes must be in 1..65536, got 0");
  EXPECT_EQ(UsageError({"--num_nodes", "-1", "p"}),
            "--num_nodes must be in 1..65536, got -1");
  EXPECT_EQ(UsageError({"--num_gpus", "-1", "p"}),
            "--num_gpus must be in 1..1024, got -1");
  EXPECT_EQ(UsageError({"--num_gpus", "0", "p"}),
            "--num_gpus must be in 1..1024, got 0");
  EXPECT_EQ(UsageError({"--master_port", "70000", "p"}),
            "--master_port must be in 1..65535, got 70000");
  EXPECT_EQ(UsageError({"--ssh_port", "-1", "p"}),
            "--ssh_port must be in 1..65535, got -1");
  EXPECT_EQ(UsageError({"--ssh_port", "0", "p"}),
            "--ssh_port must be in 1..65535, got 0");
  EXPECT_EQ(UsageError({"--ssh_fanout", "0", "p"}),
            "--ssh_fanout must be in 1..1024, got 0");
  EXPECT_EQ(UsageError({"--ssh_fanout", "100000", "p"}),
            "--ssh_fanout must be in 1..1024, got 100000");
  EXPECT_NE(UsageError({"--num_nodes", "99999999999", "p"}).find("--num_nodes"),
            std::string::npos);
}

TEST(Flags, GivenEmptyValueIsAnErrorNotTheDefault) {
  EXPECT_EQ(UsageError({"-i", "", "p"}),
            "--include: empty value (leave the flag out for its default)");
  EXPECT_EQ(UsageError({"-e", "", "p"}),
            "--exclude: empty value (leave the flag out for its default)");
  EXPECT_EQ(UsageError({"--hostfile", "", "p"}),
            "--hostfile: empty value (leave the flag out for its default)");
  EXPECT_EQ(UsageError({"--export", "", "p"}),
            "--export: empty value (leave the flag out for its default)");
  EXPECT_EQ(UsageError({"--master_addr=", "p"}),
            "--master_addr: empty value (leave the flag out for its default)");
}

TEST(Flags, UnknownLogLevelIsRejected) {
  EXPECT_NE(UsageError({"--log_level", "verbose", "p"}).find("--log_level"),
            std::string::npos);
}

TEST(Flags, UnknownOptionBeforeProgramIsAnErrorNamingIt) {
  const std::string rest =
      "' (dslaunch --help lists the options; put -- before a PROGRAM that "
      "starts with '-')";
  EXPECT_EQ(UsageError({"--hostfile", "h", "--bogus_flag", "python", "x.py"}),
            "unknown option '--bogus_flag" + rest);
  EXPECT_EQ(UsageError({"--bogus=1", "python"}),
            "unknown option '--bogus" + rest);
  EXPECT_EQ(UsageError({"-x", "python"}), "unknown option '-x" + rest);
  EXPECT_EQ(UsageError({"--no_python"}), "unknown option '--no_python" + rest);
}

TEST(Flags, DoubleDashLetsAProgramStartWithADash) {
  int exit_now;
  auto o = Parse({"--", "--weird-program", "--bogus"}, &exit_now);
  ASSERT_TRUE(o.ok()) << o.status().message();
  EXPECT_EQ(o->program,
            (std::vector<std::string>{"--weird-program", "--bogus"}));
}

TEST(Flags, EverythingFromProgramOnIsByteExactEvenWhenItLooksLikeFlags) {
  int exit_now;
  auto o = Parse({"--num_gpus", "1", "python", "-m", "pkg", "--kill_grace",
                  "nan", "-i", "", "--", "--bogus", "\xff\x01"},
                 &exit_now);
  ASSERT_TRUE(o.ok()) << o.status().message();
  EXPECT_EQ(o->program, (std::vector<std::string>{
                            "python", "-m", "pkg", "--kill_grace", "nan", "-i",
                            "", "--", "--bogus", "\xff\x01"}));
  EXPECT_EQ(o->kill_grace_s, 5);
}

}  // namespace
}  // namespace dslaunch::launcher
