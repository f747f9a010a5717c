#include "launcher/plan/rank_command.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

namespace dslaunch::launcher {
namespace {

namespace fs = std::filesystem;
using Argv = std::vector<std::string>;

// A directory with an executable bin/python3 that links elsewhere, like a
// venv's.
class RankCommandTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("dsl-rankcmd-" + std::to_string(::getpid()));
    fs::create_directories(dir_ / "base");
    fs::create_directories(dir_ / "venv" / "bin");
    std::ofstream(dir_ / "base" / "python3.11") << "#!/bin/sh\n";
    fs::permissions(dir_ / "base" / "python3.11", fs::perms::owner_all);
    fs::create_symlink(dir_ / "base" / "python3.11",
                       dir_ / "venv" / "bin" / "python3");
  }
  void TearDown() override { fs::remove_all(dir_); }
  RankCommandInputs Inputs(Argv program) {
    RankCommandInputs in;
    in.program = std::move(program);
    in.path = "/nonexistent:" + (dir_ / "venv" / "bin").string() + ":/usr/bin";
    return in;
  }
  std::string Python() const { return (dir_ / "venv" / "bin" / "python3"); }
  fs::path dir_;
};

TEST_F(RankCommandTest,
       PythonScriptRunsWithTheVenvInterpreterInDeepSpeedOrder) {
  auto cmd = MakeRankCommand(Inputs({"train.py", "--deepspeed", "x y"}));
  ASSERT_TRUE(cmd.ok()) << cmd.status().message();
  // The venv's python3 as found, not the interpreter it links to.
  EXPECT_EQ(cmd->argv,
            (Argv{Python(), "-u", "train.py", "--deepspeed", "x y"}));
  EXPECT_EQ(cmd->local_rank_at, 3);  // right after the script
}

TEST_F(RankCommandTest, ModuleRunsWithDashM) {
  RankCommandInputs in = Inputs({"pkg.train", "--lr", "1"});
  in.module = true;
  auto cmd = MakeRankCommand(in);
  ASSERT_TRUE(cmd.ok());
  EXPECT_EQ(cmd->argv, (Argv{Python(), "-u", "-m", "pkg.train", "--lr", "1"}));
  EXPECT_EQ(cmd->local_rank_at, 4);
}

TEST_F(RankCommandTest, NoPythonRunsTheProgramWithTheFlagAfterIt) {
  RankCommandInputs in = Inputs({"./train.py", "a"});
  in.no_python = true;
  auto cmd = MakeRankCommand(in);
  ASSERT_TRUE(cmd.ok());
  EXPECT_EQ(cmd->argv, (Argv{"./train.py", "a"}));
  EXPECT_EQ(cmd->local_rank_at, 1);
}

TEST_F(RankCommandTest, OtherProgramsRunAsGivenWithTheFlagAtTheEnd) {
  auto cmd = MakeRankCommand(Inputs({"dsworker", "train", "--config", "c"}));
  ASSERT_TRUE(cmd.ok());
  EXPECT_EQ(cmd->argv, (Argv{"dsworker", "train", "--config", "c"}));
  EXPECT_EQ(cmd->local_rank_at, 4);
}

TEST_F(RankCommandTest, NoLocalRankPutsTheFlagNowhere) {
  RankCommandInputs in = Inputs({"train.py"});
  in.no_local_rank = true;
  auto cmd = MakeRankCommand(in);
  ASSERT_TRUE(cmd.ok());
  EXPECT_EQ(cmd->local_rank_at, -1);
}

TEST_F(RankCommandTest, DslaunchPythonWins) {
  RankCommandInputs in = Inputs({"train.py"});
  in.dslaunch_python = "/opt/py/bin/python";
  auto cmd = MakeRankCommand(in);
  ASSERT_TRUE(cmd.ok());
  EXPECT_EQ(cmd->argv.front(), "/opt/py/bin/python");
}

TEST_F(RankCommandTest, RelativePathEntriesGiveAnAbsoluteInterpreter) {
  RankCommandInputs in = Inputs({"train.py"});
  const fs::path cwd = fs::current_path();
  fs::current_path(dir_);
  in.path = "venv/bin";
  auto cmd = MakeRankCommand(in);
  fs::current_path(cwd);
  ASSERT_TRUE(cmd.ok());
  EXPECT_EQ(cmd->argv.front(), Python());
}

TEST_F(RankCommandTest, NoInterpreterOrBothFlagsIsAUsageError) {
  RankCommandInputs in = Inputs({"train.py"});
  in.path = "/nonexistent";
  auto cmd = MakeRankCommand(in);
  ASSERT_FALSE(cmd.ok());
  EXPECT_EQ(cmd.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(cmd.status().message().find("DSLAUNCH_PYTHON"), std::string::npos);
  in = Inputs({"train.py"});
  in.no_python = in.module = true;
  cmd = MakeRankCommand(in);
  ASSERT_FALSE(cmd.ok());
  EXPECT_NE(cmd.status().message().find("--no_python and --module"),
            std::string::npos);
}

}  // namespace
}  // namespace dslaunch::launcher
