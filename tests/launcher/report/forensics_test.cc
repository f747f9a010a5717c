#include "launcher/report/forensics.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <deque>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <string>
#include <vector>

namespace dslaunch::launcher {
namespace {

namespace fs = std::filesystem;
using Lines = std::vector<std::string>;

// What torch.distributed.elastic's @record writes to TORCHELASTIC_ERROR_FILE.
std::string TorchErrorFile(const std::string& message,
                           const std::string& callstack) {
  nlohmann::json doc;
  doc["message"]["message"] = message;
  doc["message"]["extraInfo"]["py_callstack"] = callstack;
  doc["message"]["extraInfo"]["timestamp"] = "1700000000";
  return doc.dump();
}

const char kCallstack[] =
    "Traceback (most recent call last):\n"
    "  File \"/app/train.py\", line 40, in <module>\n"
    "    main()\n"
    "  File \"/app/train.py\", line 31, in main\n"
    "    raise RuntimeError(\"boom\")\n"
    "RuntimeError: boom\n";

TEST(DescribeErrorFile, ShowsTheExceptionAndTheTracebackOfTorchsFormat) {
  EXPECT_EQ(
      DescribeErrorFile(TorchErrorFile("RuntimeError: boom", kCallstack)),
      (Lines{"exception: RuntimeError: boom",
             "  Traceback (most recent call last):",
             "    File \"/app/train.py\", line 40, in <module>", "      main()",
             "    File \"/app/train.py\", line 31, in main",
             "      raise RuntimeError(\"boom\")", "  RuntimeError: boom"}));
}

TEST(DescribeErrorFile, ReadsTheLiteralTextTorchWrites) {
  const std::string file =
      R"({"message": {"message": "RuntimeError: boom", "extraInfo": )"
      R"({"py_callstack": "Traceback (most recent call last):\n  File )"
      R"(\"t.py\", line 1, in <module>\nRuntimeError: boom\n", )"
      R"("timestamp": "1700000000"}}})";
  EXPECT_EQ(DescribeErrorFile(file),
            (Lines{"exception: RuntimeError: boom",
                   "  Traceback (most recent call last):",
                   "    File \"t.py\", line 1, in <module>",
                   "  RuntimeError: boom"}));
}

TEST(DescribeErrorFile, ShowsOnlyTheLastFramesOfALongTraceback) {
  EXPECT_EQ(
      DescribeErrorFile(TorchErrorFile("RuntimeError: boom", kCallstack), 3),
      (Lines{"exception: RuntimeError: boom", "traceback (last 3 of 6 lines):",
             "    File \"/app/train.py\", line 31, in main",
             "      raise RuntimeError(\"boom\")", "  RuntimeError: boom"}));
}

TEST(DescribeErrorFile, ShowsTheWholeTracebackWhenItFitsExactly) {
  const Lines lines =
      DescribeErrorFile(TorchErrorFile("E", kCallstack), /*frames=*/6);
  ASSERT_EQ(lines.size(), 7u);
  EXPECT_EQ(lines[1], "  Traceback (most recent call last):");
}

TEST(DescribeErrorFile, DropsTrailingBlankLinesOfTheTraceback) {
  EXPECT_EQ(
      DescribeErrorFile(TorchErrorFile("E", "line one\nlast\n\n  \n\t\n")),
      (Lines{"exception: E", "  line one", "  last"}));
}

TEST(DescribeErrorFile, ReadsTheOlderPlainStringMessage) {
  EXPECT_EQ(DescribeErrorFile(R"({"message": "ValueError: bad shape"})"),
            Lines{"exception: ValueError: bad shape"});
}

TEST(DescribeErrorFile, ShowsATracebackWithoutAMessage) {
  EXPECT_EQ(DescribeErrorFile(
                R"({"message": {"extraInfo": {"py_callstack": "a\nb"}}})"),
            (Lines{"  a", "  b"}));
}

TEST(DescribeErrorFile, IsEmptyForAnythingElse) {
  for (const char* text :
       {"", "garbage", "{", "[1, 2]", "\"message\"", "{}", R"({"msg": "x"})",
        R"({"message": 3})", R"({"message": null})", R"({"message": ""})",
        R"({"message": {}})", R"({"message": {"message": 5, "extraInfo": []}})",
        R"({"message": {"extraInfo": {"py_callstack": 7}}})",
        R"({"message": {"message": "", "extraInfo": "x"}})"}) {
    EXPECT_EQ(DescribeErrorFile(text), Lines{}) << text;
  }
}

TEST(DescribeErrorFile, EscapesControlCharacters) {
  const Lines lines = DescribeErrorFile(TorchErrorFile(
      "Error: \x1b[2Jcleared\r\nnext\x07", "frame \x1b]0;t\x07\n"));
  EXPECT_EQ(lines,
            (Lines{"exception: Error: \\u001b[2Jcleared\\u000d\\u000anext"
                   "\\u0007",
                   "  frame \\u001b]0;t\\u0007"}));
  for (const std::string& line : lines)
    for (unsigned char c : line) EXPECT_GE(c, 0x20) << line;
}

TEST(DescribeErrorFile, BoundsLongLines) {
  const std::string long_text(5000, 'x');
  const Lines lines = DescribeErrorFile(TorchErrorFile(long_text, long_text));
  ASSERT_EQ(lines.size(), 2u);
  EXPECT_EQ(lines[0], "exception: " + std::string(400, 'x') + "...");
  EXPECT_EQ(lines[1], "  " + std::string(400, 'x') + "...");
}

TEST(DescribeErrorFile, BoundsTheNumberOfLinesOfAHugeTraceback) {
  std::string stack;
  for (int i = 0; i < 100000; ++i)
    stack += "  frame " + std::to_string(i) + "\n";
  const Lines lines = DescribeErrorFile(TorchErrorFile("E", stack));
  ASSERT_EQ(lines.size(), 2u + 8u);
  EXPECT_EQ(lines[1], "traceback (last 8 of 100000 lines):");
  EXPECT_EQ(lines.back(), "    frame 99999");
}

// ---- secrets ----

TEST(IsSecretName, NamesCredentials) {
  for (const char* name :
       {"DSLAUNCH_AGENT_SECRET", "HF_TOKEN", "AWS_SECRET_ACCESS_KEY",
        "WANDB_API_KEY", "AWS_SESSION_TOKEN", "GITHUB_TOKEN", "DB_PASSWORD",
        "SMTP_PASSWD", "GOOGLE_APPLICATION_CREDENTIALS", "SSH_PRIVATE_KEY_FILE",
        "BASIC_AUTH", "OPENAI_API_KEY", "hf_token", "Wandb_Api_Key", "KEY"}) {
    EXPECT_TRUE(IsSecretName(name)) << name;
  }
}

TEST(IsSecretName, KeepsOrdinaryVariables) {
  for (const char* name :
       {"PATH", "HOME", "LD_LIBRARY_PATH", "MASTER_ADDR", "MASTER_PORT",
        "CUDA_VISIBLE_DEVICES", "NCCL_DEBUG", "PYTHONPATH", "WORLD_SIZE",
        "KEYBOARD", "LANG", "", "KE"}) {
    EXPECT_FALSE(IsSecretName(name)) << name;
  }
}

TEST(RedactedEnv, HidesSecretValuesAndKeepsTheRest) {
  const EnvList env = {{"PATH", "/usr/bin:/bin"},
                       {"HF_TOKEN", "hf_abc"},
                       {"DSLAUNCH_AGENT_SECRET", "s3cr3t-value"},
                       {"AWS_SECRET_ACCESS_KEY", "aws"},
                       {"WANDB_API_KEY", "wandb"},
                       {"MASTER_ADDR", "10.0.0.1"}};
  EXPECT_EQ(RedactedEnv(env, ""),
            "PATH=/usr/bin:/bin\n"
            "HF_TOKEN=<redacted>\n"
            "DSLAUNCH_AGENT_SECRET=<redacted>\n"
            "AWS_SECRET_ACCESS_KEY=<redacted>\n"
            "WANDB_API_KEY=<redacted>\n"
            "MASTER_ADDR=10.0.0.1\n");
}

TEST(RedactedEnv, HidesAnyValueContainingTheJobSecret) {
  const EnvList env = {{"DSL_URL", "tcp://host:29500?auth=0123abcdef&x=1"},
                       {"PLAIN", "0123abcde"},
                       {"COPY", "0123abcdef"}};
  EXPECT_EQ(RedactedEnv(env, "0123abcdef"),
            "DSL_URL=<redacted>\nPLAIN=0123abcde\nCOPY=<redacted>\n");
}

TEST(RedactedEnv, HidesTheCredentialsOfUrls) {
  const EnvList env = {
      {"INDEX", "https://user:pa55@pypi.example/simple"},
      {"PIP_EXTRA_INDEX_URL", "https://tok123@pypi.fury.io/acme/"},
      {"DB", "postgres://u:p@ss@db/x"},
      {"GIT", "git+https://ghp_abc@github.com/o/r.git@v1"},
      {"TWO", "https://a:b@h1/ https://c@h2?x=@y"},
      {"PLAIN", "https://host:8080/path?q=a@b"},
      {"MAIL", "me@example.org and ftp://host"}};
  EXPECT_EQ(RedactedEnv(env, ""),
            "INDEX=https://user:<redacted>@pypi.example/simple\n"
            "PIP_EXTRA_INDEX_URL=https://<redacted>@pypi.fury.io/acme/\n"
            "DB=postgres://u:<redacted>@db/x\n"
            "GIT=git+https://<redacted>@github.com/o/r.git@v1\n"
            "TWO=https://a:<redacted>@h1/ https://<redacted>@h2?x=@y\n"
            "PLAIN=https://host:8080/path?q=a@b\n"
            "MAIL=me@example.org and ftp://host\n");
}

TEST(RedactedEnv, DoesNotHideEverythingWithoutAJobSecret) {
  EXPECT_EQ(RedactedEnv({{"A", ""}, {"B", "x"}}, ""), "A=\nB=x\n");
}

TEST(RedactedEnv, EscapesControlCharactersInNamesAndValues) {
  EXPECT_EQ(RedactedEnv({{"A\nB", "x\ny\x1b"}}, ""),
            "A\\u000aB=x\\u000ay\\u001b\n");
}

// ---- WriteFailureBundle ----

std::string ReadFile(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::set<std::string> Names(const fs::path& dir) {
  std::set<std::string> names;
  for (const auto& e : fs::directory_iterator(dir))
    names.insert(e.path().filename().string());
  return names;
}

const std::deque<std::string> kLines0 = {"epoch 1", "bad \x1b[31mred"};
const std::deque<std::string> kLines3 = {"Traceback", "RuntimeError: boom"};

class FailureBundleTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("dsl-forensics-" + std::to_string(::getpid()) + "-" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  static FailureRecord Record() {
    FailureRecord r;
    r.report = {"dslaunch: rank 3 exited with code 1", "2 of 4 ranks failed"};
    r.plan = "host   node  rank\nnode-a 0     0\n";
    r.rank_env = {{"MASTER_ADDR", "10.0.0.1"}, {"HF_TOKEN", "hf_x"}};
    r.launcher_env = {{"PATH", "/usr/bin"}, {"DSL_JOIN", "key=the-job-secret"}};
    r.job_secret = "the-job-secret";
    r.last_lines[0] = &kLines0;
    r.last_lines[3] = &kLines3;
    r.stacks[3] = "Thread 0x1 (most recent call first):\n  File x\n";
    r.error_files[3] = R"({"message": "RuntimeError: boom"})";
    return r;
  }

  fs::path dir_;
};

TEST_F(FailureBundleTest, WritesEveryFileOfTheBundle) {
  const auto out = WriteFailureBundle(dir_.string(), Record());
  ASSERT_TRUE(out.ok()) << out.status().message();
  const fs::path failure = dir_ / "failure";
  EXPECT_EQ(*out, failure.string());
  EXPECT_EQ(Names(failure),
            (std::set<std::string>{"report.txt", "plan.txt", "env.txt",
                                   "last-lines.txt", "stacks-rank-3.txt",
                                   "error-file-rank-3.json"}));
  EXPECT_EQ(ReadFile(failure / "report.txt"),
            "dslaunch: rank 3 exited with code 1\n2 of 4 ranks failed\n");
  EXPECT_EQ(ReadFile(failure / "plan.txt"),
            "host   node  rank\nnode-a 0     0\n");
  EXPECT_EQ(ReadFile(failure / "env.txt"),
            "# what every rank got on top of its agent's environment\n"
            "MASTER_ADDR=10.0.0.1\n"
            "HF_TOKEN=<redacted>\n"
            "\n# the launcher's environment\n"
            "PATH=/usr/bin\n"
            "DSL_JOIN=<redacted>\n");
  EXPECT_EQ(ReadFile(failure / "last-lines.txt"),
            "== rank 0 ==\nepoch 1\nbad \\u001b[31mred\n"
            "== rank 3 ==\nTraceback\nRuntimeError: boom\n");
  EXPECT_EQ(ReadFile(failure / "stacks-rank-3.txt"),
            "Thread 0x1 (most recent call first):\n  File x\n");
  EXPECT_EQ(ReadFile(failure / "error-file-rank-3.json"),
            R"({"message": "RuntimeError: boom"})");
}

TEST_F(FailureBundleTest, NeverWritesTheSecretDown) {
  ASSERT_TRUE(WriteFailureBundle(dir_.string(), Record()).ok());
  for (const auto& e : fs::directory_iterator(dir_ / "failure")) {
    const std::string text = ReadFile(e.path());
    EXPECT_EQ(text.find("the-job-secret"), std::string::npos) << e.path();
    EXPECT_EQ(text.find("hf_x"), std::string::npos) << e.path();
  }
}

TEST_F(FailureBundleTest, KeepsTheFilesFromOthersEyes) {
  ASSERT_TRUE(WriteFailureBundle(dir_.string(), Record()).ok());
  for (const auto& e : fs::directory_iterator(dir_ / "failure")) {
    struct stat st;
    ASSERT_EQ(::stat(e.path().c_str(), &st), 0);
    EXPECT_EQ(st.st_mode & 0007, 0u) << e.path();
  }
  struct stat st;
  ASSERT_EQ(::stat((dir_ / "failure").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0007, 0u);
}

TEST_F(FailureBundleTest, ReplacesWhatAnEarlierBundleLeft) {
  ASSERT_TRUE(WriteFailureBundle(dir_.string(), Record()).ok());
  { std::ofstream(dir_ / "failure" / "notes.txt") << "mine\n"; }
  FailureRecord second;
  second.report = {"second"};
  second.stacks[5] = "stack of 5\n";
  ASSERT_TRUE(WriteFailureBundle(dir_.string(), second).ok());
  const fs::path failure = dir_ / "failure";
  EXPECT_EQ(Names(failure),
            (std::set<std::string>{"report.txt", "plan.txt", "env.txt",
                                   "last-lines.txt", "stacks-rank-5.txt",
                                   "notes.txt"}));
  EXPECT_EQ(ReadFile(failure / "report.txt"), "second\n");
  EXPECT_EQ(ReadFile(failure / "plan.txt"), "");
  EXPECT_EQ(ReadFile(failure / "last-lines.txt"), "");
  EXPECT_EQ(ReadFile(failure / "stacks-rank-5.txt"), "stack of 5\n");
  EXPECT_EQ(ReadFile(failure / "notes.txt"), "mine\n");  // not ours
}

TEST_F(FailureBundleTest, RefusesAFailureDirectoryThatIsASymlink) {
  const fs::path other = dir_ / "somebody-else";
  fs::create_directories(other);
  { std::ofstream(other / "report.txt") << "precious report\n"; }
  { std::ofstream(other / "stacks-rank-1.txt") << "precious stack\n"; }
  const fs::path logs = dir_ / "logs";
  fs::create_directories(logs);
  fs::create_directory_symlink(other, logs / "failure");

  const auto out = WriteFailureBundle(logs.string(), Record());
  EXPECT_FALSE(out.ok());
  EXPECT_EQ(Names(other),
            (std::set<std::string>{"report.txt", "stacks-rank-1.txt"}));
  EXPECT_EQ(ReadFile(other / "report.txt"), "precious report\n");
  EXPECT_EQ(ReadFile(other / "stacks-rank-1.txt"), "precious stack\n");
  EXPECT_TRUE(fs::is_symlink(logs / "failure"));
}

TEST_F(FailureBundleTest, RefusesToWriteThroughASymlinkedFileInTheBundle) {
  const fs::path victim = dir_ / "victim.txt";
  { std::ofstream(victim) << "precious\n"; }
  fs::create_directories(dir_ / "failure");
  // An earlier bundle's name, planted as a link: removed, never followed.
  fs::create_symlink(victim, dir_ / "failure" / "report.txt");
  ASSERT_TRUE(WriteFailureBundle(dir_.string(), Record()).ok());
  EXPECT_EQ(ReadFile(victim), "precious\n");
  EXPECT_FALSE(fs::is_symlink(dir_ / "failure" / "report.txt"));
}

TEST_F(FailureBundleTest, RefusesAFailureDirectoryOfAnotherUser) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root to give a directory away";
  const fs::path failure = dir_ / "failure";
  fs::create_directories(failure);
  { std::ofstream(failure / "report.txt") << "theirs\n"; }
  ASSERT_EQ(::chown(failure.c_str(), 65534, 65534), 0);
  const auto out = WriteFailureBundle(dir_.string(), Record());
  ASSERT_FALSE(out.ok());
  EXPECT_NE(out.status().message().find("belongs to another user"),
            std::string::npos)
      << out.status().message();
  EXPECT_EQ(ReadFile(failure / "report.txt"), "theirs\n");
}

TEST_F(FailureBundleTest, RefusesALogDirectoryOfAnotherUser) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root to give a directory away";
  // Its owner would read the bundle (and the environment in it).
  const fs::path theirs = dir_ / "theirs";
  fs::create_directories(theirs);
  ASSERT_EQ(::chown(theirs.c_str(), 65534, 65534), 0);
  const auto out = WriteFailureBundle(theirs.string(), Record());
  ASSERT_FALSE(out.ok());
  EXPECT_NE(
      out.status().message().find(theirs.string() + " belongs to another user"),
      std::string::npos)
      << out.status().message();
  EXPECT_TRUE(fs::is_empty(theirs));
}

TEST_F(FailureBundleTest, CreatesTheLogDirectory) {
  const fs::path logs = dir_ / "a" / "b";
  ASSERT_TRUE(WriteFailureBundle(logs.string(), Record()).ok());
  EXPECT_TRUE(fs::is_regular_file(logs / "failure" / "report.txt"));
}

TEST_F(FailureBundleTest, FailsWhenTheLogDirectoryIsAFile) {
  { std::ofstream(dir_ / "file") << "x"; }
  EXPECT_FALSE(WriteFailureBundle((dir_ / "file").string(), Record()).ok());
}

}  // namespace
}  // namespace dslaunch::launcher
