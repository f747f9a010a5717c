#include "launcher/plan/job_env.h"

#include <gtest/gtest.h>
#include <sys/stat.h>  // chmod, mkfifo
#include <sys/wait.h>  // waitpid
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <vector>

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

// ---- env files someone else could have planted ----

class EnvFileTrustTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/dsl-envtrust-XXXXXX";
    dir_ = ::mkdtemp(tmpl);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  // `path` as the .deepspeed_env of the job, and as its --env_file.
  std::vector<Status> Collect(const std::filesystem::path& path) {
    std::vector<Status> out;
    JobEnvSources ds;
    ds.deepspeed_env_files = {path.string()};
    out.push_back(CollectJobEnv(ds).status());
    JobEnvSources flag;
    flag.env_files = {path.string()};
    out.push_back(CollectJobEnv(flag).status());
    return out;
  }
  // Both refused with a data error (exit 65) that begins with the file.
  void ExpectRefused(const std::filesystem::path& path,
                     const std::string& why) {
    for (const Status& st : Collect(path)) {
      ASSERT_FALSE(st.ok()) << path;
      EXPECT_EQ(st.code(), StatusCode::kDataError);
      EXPECT_EQ(st.message(), "env file " + path.string() + ": " + why);
    }
  }
  std::filesystem::path dir_;
};

TEST_F(EnvFileTrustTest, RefusesAFileOfAnotherUser) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root to give a file away";
  const auto planted = dir_ / ".deepspeed_env";
  std::ofstream(planted) << "LD_PRELOAD=/tmp/evil.so\n";
  ::chmod(planted.c_str(), 0644);
  ASSERT_EQ(::chown(planted.c_str(), 65534, 65534), 0);
  ExpectRefused(planted, "belongs to another user (uid 65534); not read");
}

TEST_F(EnvFileTrustTest, RefusesAFileWritableByEveryone) {
  const auto planted = dir_ / ".deepspeed_env";
  std::ofstream(planted) << "LD_PRELOAD=/tmp/evil.so\n";
  ASSERT_EQ(::chmod(planted.c_str(), 0666), 0);
  ExpectRefused(planted, "writable by every user; not read");
}

// A FIFO hung the launcher in open(); /dev/zero made it allocate until
// std::bad_alloc. Both are refused at once.
TEST_F(EnvFileTrustTest, RefusesAPipeOrADeviceWithoutBlocking) {
  const auto fifo = dir_ / "fifo";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  const auto zero = dir_ / "zero";
  std::filesystem::create_symlink("/dev/zero", zero);
  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    ::alarm(10);  // the old code never returns here
    int refused = 0;
    for (const auto& path : {fifo, zero}) {
      for (const Status& st : Collect(path)) {
        refused += st.code() == StatusCode::kDataError &&
                   st.message().find("not a regular file") != std::string::npos;
      }
    }
    ::_exit(refused == 4 ? 0 : 1);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0)
      << "status " << status << " (a signal: it hung or crashed)";
}

TEST_F(EnvFileTrustTest, RefusesAFileOverOneMebibyte) {
  const auto big = dir_ / "big.env";
  {
    std::ofstream out(big);
    const std::string line = "A=" + std::string(1000, 'x') + "\n";
    for (size_t n = 0; n <= kMaxEnvFileBytes; n += line.size()) out << line;
  }
  ExpectRefused(big, "larger than 1048576 bytes");
}

TEST_F(EnvFileTrustTest, AMissingDeepSpeedEnvIsSkippedAMissingEnvFileIsNot) {
  const std::vector<Status> st = Collect(dir_ / "none");
  EXPECT_TRUE(st[0].ok()) << st[0].message();
  ASSERT_FALSE(st[1].ok());
  EXPECT_EQ(st[1].code(), StatusCode::kDataError);
  EXPECT_NE(st[1].message().find((dir_ / "none").string()), std::string::npos);
}

TEST_F(EnvFileTrustTest, ReadsAFileOfThisUserThroughALink) {
  std::ofstream(dir_ / "dotfiles-env") << "A=1\n";
  std::filesystem::create_symlink(dir_ / "dotfiles-env",
                                  dir_ / ".deepspeed_env");
  for (const Status& st : Collect(dir_ / ".deepspeed_env")) {
    EXPECT_TRUE(st.ok()) << st.message();
  }
}

}  // namespace
}  // namespace dslaunch::launcher
