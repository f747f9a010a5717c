#include "launcher/flags.h"

#include <gtest/gtest.h>

#include <vector>

#include "launcher/plan/job_hosts.h"
#include "launcher/shell_words.h"

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
  auto h = LoadJobHostfile("", 0);
  ASSERT_TRUE(h.ok());
  ASSERT_EQ(h->hosts.size(), 1u);
  EXPECT_EQ(h->hosts[0].host, "localhost");
  EXPECT_GE(h->hosts[0].slots, 1);
}

TEST(Flags, NamedHostfileThatIsMissingIsAnError) {
  auto h = LoadJobHostfile("/nonexistent/hosts", 0);
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

TEST(Flags, RestartFlagsAreCheckedAndNeverIgnored) {
  EXPECT_EQ(UsageError({"--max_restarts", "-1", "p"}),
            "--max_restarts must be in 0..10000, got -1");
  EXPECT_EQ(UsageError({"--max_restarts", "10001", "p"}),
            "--max_restarts must be in 0..10000, got 10001");
  EXPECT_EQ(UsageError({"--max_restarts", "2", "--restart_backoff", "-1", "p"}),
            "--restart_backoff must be a number of seconds in [0, 3600], got "
            "-1");
  EXPECT_EQ(UsageError({"--restart_backoff", "2", "p"}),
            "--restart_backoff needs --max_restarts N: without it the job "
            "never restarts");
  // Under openmpi every generation is a new mpirun over every node: no
  // elastic membership.
  EXPECT_NE(UsageError({"--launcher", "openmpi", "--max_restarts", "1",
                        "--num_nodes", "1:2", "p"})
                .find("--num_nodes MIN:MAX is not supported with --launcher "
                      "openmpi: each generation is a new mpirun"),
            std::string::npos);
  int exit_now = -1;
  EXPECT_TRUE(
      Parse({"--launcher", "openmpi", "--max_restarts", "1", "p"}, &exit_now)
          .ok());
  auto o = Parse({"--max_restarts", "3", "--restart_backoff", "0.5", "p"},
                 &exit_now);
  ASSERT_TRUE(o.ok()) << o.status().message();
  EXPECT_EQ(o->max_restarts, 3);
  EXPECT_EQ(o->restart_backoff_s, 0.5);
  o = Parse({"p"}, &exit_now);
  ASSERT_TRUE(o.ok());
  EXPECT_EQ(o->max_restarts, 0);  // torchrun's default
  EXPECT_EQ(o->restart_backoff_s, 1);
}

TEST(Flags, NumNodesMinMaxIsCheckedAndNeedsRestarts) {
  EXPECT_EQ(UsageError({"--num_nodes", "2:3", "p"}),
            "--num_nodes MIN:MAX needs --max_restarts N: the job runs on fewer "
            "nodes, or on spares, only in a generation after a failure");
  EXPECT_EQ(UsageError({"--max_restarts", "1", "--num_nodes", "3:2", "p"}),
            "--num_nodes 3:2: need 1 <= MIN <= MAX <= 65536");
  EXPECT_EQ(UsageError({"--max_restarts", "1", "--num_nodes", "0:2", "p"}),
            "--num_nodes 0:2: need 1 <= MIN <= MAX <= 65536");
  EXPECT_EQ(UsageError({"--max_restarts", "1", "--num_nodes", "2:x", "p"}),
            "--num_nodes must be N or MIN:MAX (whole numbers), got '2:x'");
  EXPECT_EQ(UsageError({"--max_restarts", "1", "--num_nodes", ":3", "p"}),
            "--num_nodes must be N or MIN:MAX (whole numbers), got ':3'");
  EXPECT_EQ(UsageError({"--max_restarts", "1", "--join_settle", "5", "p"}),
            "--join_settle needs --num_nodes MIN:MAX: with a fixed number of "
            "nodes a generation always waits for all of them");
  EXPECT_EQ(UsageError({"--max_restarts", "1", "--num_nodes", "1:2",
                        "--join_settle", "-1", "p"}),
            "--join_settle must be a number of seconds in [0, 86400], got -1");
  int exit_now = -1;
  auto o = Parse(
      {"--max_restarts", "1", "--num_nodes", "2:4", "--join_settle", "3", "p"},
      &exit_now);
  ASSERT_TRUE(o.ok()) << o.status().message();
  EXPECT_EQ(o->plan.min_nodes, 2);
  EXPECT_EQ(o->plan.num_nodes, 4);
  EXPECT_EQ(o->join_settle_s, 3);
  o = Parse({"--num_nodes", "3", "p"}, &exit_now);
  ASSERT_TRUE(o.ok());
  EXPECT_EQ(o->plan.min_nodes, -1);  // N: a fixed size, no spares
  EXPECT_EQ(o->plan.num_nodes, 3);
  EXPECT_EQ(o->join_settle_s, 10);
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
  EXPECT_EQ(UsageError({"--no_such_flag"}),
            "unknown option '--no_such_flag" + rest);
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

TEST(Flags, DeepSpeedLauncherFlagsKeepTheirMeaning) {
  int exit_now;
  auto o =
      Parse({"--no_python", "--launcher_args", "-x 'a b' \"c\\\"d\"",
             "--no_ssh_check", "--force_multi", "--save_pid",
             "--enable_each_rank_log", "/tmp/logs", "--bind_cores_to_rank",
             "--bind_core_list", "1,3-5,7", "--num_accelerators", "2", "prog"},
            &exit_now);
  ASSERT_TRUE(o.ok()) << o.status().message();
  EXPECT_TRUE(o->no_python);
  EXPECT_EQ(o->launcher_words, (std::vector<std::string>{"-x", "a b", "c\"d"}));
  EXPECT_TRUE(o->no_ssh_check);
  EXPECT_TRUE(o->force_multi);
  EXPECT_TRUE(o->save_pid);
  EXPECT_EQ(o->each_rank_log_dir, "/tmp/logs");
  EXPECT_TRUE(o->bind_cores_to_rank);
  EXPECT_EQ(o->bind_cores, (std::vector<int>{1, 3, 4, 5, 7}));
  EXPECT_EQ(o->plan.num_gpus, 2);
  o = Parse({"-m", "pkg.mod", "--x"}, &exit_now);
  ASSERT_TRUE(o.ok()) << o.status().message();
  EXPECT_TRUE(o->module);
  EXPECT_EQ(o->program, (std::vector<std::string>{"pkg.mod", "--x"}));
}

TEST(Flags, DeepSpeedFlagsWeDoNotDoAreRefusedWithAReason) {
  EXPECT_NE(UsageError({"--elastic_training", "train.py"})
                .find("--elastic_training: elastic training is not supported"),
            std::string::npos);
  EXPECT_NE(UsageError({"--min_elastic_nodes", "2", "train.py"})
                .find("--min_elastic_nodes"),
            std::string::npos);
  EXPECT_NE(UsageError({"--autotuning", "tune", "train.py"})
                .find("autotuner is not supported"),
            std::string::npos);
}

TEST(Flags, BadLauncherArgsAndCoreListsAreUsageErrors) {
  EXPECT_NE(UsageError({"--launcher_args", "-x 'open", "p"})
                .find("--launcher_args: unterminated ' quote"),
            std::string::npos);
  EXPECT_NE(UsageError({"--bind_cores_to_rank", "--bind_core_list", "1,x", "p"})
                .find("--bind_core_list: 'x' is not a CPU"),
            std::string::npos);
  EXPECT_NE(UsageError({"--bind_core_list", "1", "p"})
                .find("used with --bind_cores_to_rank"),
            std::string::npos);
  EXPECT_NE(UsageError({"--log_dir", "a", "--enable_each_rank_log", "b", "p"})
                .find("give one"),
            std::string::npos);
}

TEST(Flags, NumGpusWithoutAHostfileIsThatManyRanksHere) {
  auto h = LoadJobHostfile("", 6);
  ASSERT_TRUE(h.ok());
  ASSERT_EQ(h->hosts.size(), 1u);
  EXPECT_EQ(h->hosts[0].slots, 6);
}

TEST(SplitShellWords, SplitsAsAShellWouldWithoutExpanding) {
  auto w = SplitShellWords("  a\\ b 'c d'\"e\\$f\\g\" '' $HOME ");
  ASSERT_TRUE(w.ok()) << w.status().message();
  EXPECT_EQ(*w, (std::vector<std::string>{"a b", "c de$f\\g", "", "$HOME"}));
  EXPECT_FALSE(SplitShellWords("\"open").ok());
  EXPECT_FALSE(SplitShellWords("end\\").ok());
  EXPECT_TRUE(SplitShellWords("")->empty());
}

TEST(Flags, JoinTakesItsPortTimeoutAndSecretFile) {
  int exit_now;
  auto o = Parse({"--launcher", "join", "--num_nodes", "4", "--secret_file",
                  "/etc/dslaunch/secret", "--join_timeout", "30", "train.py"},
                 &exit_now);
  ASSERT_TRUE(o.ok()) << o.status().message();
  EXPECT_EQ(o->control_port, kJoinControlPort);
  EXPECT_EQ(o->start_timeout_s, 30);
  EXPECT_EQ(o->secret_file, "/etc/dslaunch/secret");
  o = Parse({"--launcher", "join", "--num_nodes", "1", "--secret_file", "s",
             "--control_port", "4000", "train.py"},
            &exit_now);
  ASSERT_TRUE(o.ok()) << o.status().message();
  EXPECT_EQ(o->control_port, 4000);
}

TEST(Flags, JoinRefusesWhatCannotApplyAndNeedsASecretAndANodeCount) {
  int exit_now;
  const std::vector<std::pair<std::vector<const char*>, std::string>> cases = {
      {{"--launcher", "join", "--num_nodes", "2", "t.py"},
       "needs --secret_file"},
      {{"--launcher", "join", "--secret_file", "s", "t.py"},
       "needs --num_nodes"},
      {{"--launcher", "join", "--num_nodes", "2", "--secret_file", "s", "-H",
        "h", "t.py"},
       "--hostfile does not apply"},
      {{"--launcher", "join", "--num_nodes", "2", "--secret_file", "s", "-i",
        "a", "t.py"},
       "--include does not apply"},
      {{"--launcher", "join", "--num_nodes", "2", "--secret_file", "s",
        "--launcher_args", "-x", "t.py"},
       "--launcher_args does not apply"},
      {{"--secret_file", "s", "t.py"}, "--secret_file is for --launcher join"},
      {{"--join_timeout", "5", "t.py"}, "--join_timeout is for --launcher"},
      {{"--launcher", "join", "--num_nodes", "2", "--secret_file", "s",
        "--join_timeout", "nan", "t.py"},
       "--join_timeout"},
      {{"--launcher", "join", "--num_nodes", "2", "--secret_file", "s",
        "--control_port", "70000", "t.py"},
       "--control_port must be in 1..65535"},
  };
  for (const auto& [args, want] : cases) {
    auto o = Parse(args, &exit_now);
    ASSERT_FALSE(o.ok()) << want;
    EXPECT_EQ(o.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(o.status().message().find(want), std::string::npos)
        << o.status().message();
  }
}

TEST(Flags, WatchFlagsThatWouldDoNothingAloneAreRefused) {
  int exit_now;
  auto addr = Parse({"--metrics_addr", "127.0.0.1", "p"}, &exit_now);
  ASSERT_FALSE(addr.ok());
  EXPECT_NE(addr.status().message().find("--metrics_addr needs --metrics_port"),
            std::string::npos)
      << addr.status().message();
  for (std::vector<const char*> args :
       {std::vector<const char*>{"--on_hang", "abort", "p"},
        std::vector<const char*>{"--on_hang", "warn", "--hang_timeout", "0",
                                 "p"}}) {
    auto hang = Parse(args, &exit_now);
    ASSERT_FALSE(hang.ok());
    EXPECT_NE(hang.status().message().find("--on_hang needs --hang_timeout"),
              std::string::npos)
        << hang.status().message();
  }
  auto both = Parse({"--metrics_port", "9400", "--metrics_addr", "127.0.0.1",
                     "--hang_timeout", "30", "--on_hang", "abort", "p"},
                    &exit_now);
  ASSERT_TRUE(both.ok()) << both.status().message();
  EXPECT_EQ(both->on_hang, "abort");
  EXPECT_EQ(both->metrics_addr, "127.0.0.1");
}

}  // namespace
}  // namespace dslaunch::launcher
