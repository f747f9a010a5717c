#include "launcher/plan/job_env.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>

namespace dslaunch::launcher {
namespace {

TEST(EnvFile, ParsesCommentsBlankLinesExportAndQuotes) {
  auto env = ParseEnvFile(
      "# comment\n"
      "\n"
      "A=1\n"
      "export B=two  # trailing comment\n"
      "C='single $quoted \"x\"'\n"
      "D=\"double \\\"q\\\" \\$HOME\\n\"\r\n"
      "  E=\n"
      "F=a=b\n",
      "ds_env");
  ASSERT_TRUE(env.ok()) << env.status().message();
  EnvList want = {{"A", "1"},
                  {"B", "two"},
                  {"C", "single $quoted \"x\""},
                  {"D", "double \"q\" $HOME\n"},
                  {"E", ""},
                  {"F", "a=b"}};
  EXPECT_EQ(*env, want);
}

TEST(EnvFile, MissingEqualsNamesTheLine) {
  auto env = ParseEnvFile("A=1\nNOEQUALS\n", "/x/.deepspeed_env");
  ASSERT_FALSE(env.ok());
  EXPECT_EQ(env.status().code(), StatusCode::kDataError);
  EXPECT_EQ(env.status().message(),
            "/x/.deepspeed_env:2: expected KEY=VALUE, got 'NOEQUALS'");
}

TEST(EnvFile, RejectsBadNamesUnterminatedQuotesAndUnquotedSpaces) {
  EXPECT_EQ(ParseEnvFile("1A=x\n", "f").status().message(),
            "f:1: invalid variable name '1A'");
  EXPECT_EQ(ParseEnvFile("A='x\n", "f").status().message(),
            "f:1: unterminated ' quote");
  EXPECT_EQ(ParseEnvFile("\nA=\"x\n", "f").status().message(),
            "f:2: unterminated \" quote");
  EXPECT_EQ(ParseEnvFile("A=x y\n", "f").status().message(),
            "f:1: unquoted space in value (quote the value)");
}

TEST(JobEnv, LaterSourcesWinAndOrderIsKept) {
  auto dir = std::filesystem::temp_directory_path() /
             ("dsl-jobenv-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  std::ofstream(dir / ".deepspeed_env") << "NCCL_DEBUG=WARN\nFROM_DS=1\n";
  std::ofstream(dir / "extra.env") << "FROM_FILE=2\nFROM_DS=file\n";
  const char* environ[] = {"NCCL_DEBUG=INFO", "HOME=/root", "PYTHONPATH=/p",
                           "SECRET=no", nullptr};
  JobEnvSources s;
  s.environ = environ;
  s.deepspeed_env_files = {(dir / ".deepspeed_env").string(),
                           (dir / "missing").string()};
  s.env_files = {(dir / "extra.env").string()};
  s.env = {"FROM_FILE=flag"};
  auto env = CollectJobEnv(s);
  std::filesystem::remove_all(dir);
  ASSERT_TRUE(env.ok()) << env.status().message();
  EnvList want = {{"NCCL_DEBUG", "WARN"},
                  {"PYTHONPATH", "/p"},
                  {"FROM_DS", "file"},
                  {"FROM_FILE", "flag"}};
  EXPECT_EQ(*env, want);
}

TEST(JobEnv, TheInterpreterEnvironmentAlwaysGoesWithTheJob) {
  const char* environ[] = {"PATH=/venv/bin:/usr/bin", "VIRTUAL_ENV=/venv",
                           "CONDA_PREFIX=/c",         "CONDA_DEFAULT_ENV=c",
                           "LD_LIBRARY_PATH=/l",      "PATHOLOGY=no",
                           "SSH_CLIENT=1 2 3",        "WANDB_MODE=offline",
                           "ACCELERATE_X=1",          nullptr};
  JobEnvSources s;
  s.environ = environ;
  s.export_prefixes = {"NONE_"};  // prefixes replaced: these still go
  s.env = {"CONDA_DEFAULT_ENV=flag"};
  auto env = CollectJobEnv(s);
  ASSERT_TRUE(env.ok()) << env.status().message();
  EnvList want = {{"PATH", "/venv/bin:/usr/bin"},
                  {"VIRTUAL_ENV", "/venv"},
                  {"CONDA_PREFIX", "/c"},
                  {"CONDA_DEFAULT_ENV", "flag"},
                  {"LD_LIBRARY_PATH", "/l"}};
  EXPECT_EQ(*env, want);
  s.export_prefixes = {};  // the defaults include WANDB_ and ACCELERATE_
  env = CollectJobEnv(s);
  ASSERT_TRUE(env.ok());
  EXPECT_EQ(env->size(), 7u);
  EXPECT_EQ(env->at(5),
            (std::pair<std::string, std::string>{"WANDB_MODE", "offline"}));
}

TEST(JobEnv, DeepSpeedEnvFilesAreFoundAsDeepSpeedFindsThem) {
  EXPECT_EQ(
      DeepSpeedEnvFiles("/home/u", ""),
      (std::vector<std::string>{"/home/u/.deepspeed_env", "./.deepspeed_env"}));
  EXPECT_EQ(DeepSpeedEnvFiles("/home/u", "my.env"),
            (std::vector<std::string>{"/home/u/my.env", "./my.env"}));
  EXPECT_EQ(DeepSpeedEnvFiles("", "/etc/ds.env"),
            (std::vector<std::string>{"/etc/ds.env"}));
  EXPECT_EQ(DeepSpeedEnvFiles("", ""),
            (std::vector<std::string>{"./.deepspeed_env"}));
}

TEST(JobEnv, ExportPrefixesReplaceTheDefaults) {
  const char* environ[] = {"NCCL_DEBUG=INFO", "MY_VAR=1", nullptr};
  JobEnvSources s;
  s.environ = environ;
  s.export_prefixes = {"MY_"};
  auto env = CollectJobEnv(s);
  ASSERT_TRUE(env.ok());
  EXPECT_EQ(*env, (EnvList{{"MY_VAR", "1"}}));
}

TEST(JobEnv, MissingEnvFileIsADataError) {
  JobEnvSources s;
  s.env_files = {"/nonexistent/file.env"};
  auto env = CollectJobEnv(s);
  ASSERT_FALSE(env.ok());
  EXPECT_EQ(env.status().code(), StatusCode::kDataError);
  EXPECT_NE(env.status().message().find("/nonexistent/file.env"),
            std::string::npos);
}

}  // namespace
}  // namespace dslaunch::launcher
