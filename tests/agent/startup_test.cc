#include "agent/startup.h"

#include <gtest/gtest.h>
#include <stdlib.h>  // mkdtemp, setenv
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <string>

namespace dslaunch::agent {
namespace {

// A fake environment: only these variables are set.
Getenv Env(std::map<std::string, std::string> vars) {
  auto held =
      std::make_shared<std::map<std::string, std::string>>(std::move(vars));
  return [held](const char* name) -> const char* {
    auto it = held->find(name);
    return it == held->end() ? nullptr : it->second.c_str();
  };
}

AgentFlags Flags(std::vector<std::string> args) {
  std::vector<char*> argv;
  static std::vector<std::string> keep;  // argv outlives the parse
  keep = std::move(args);
  keep.insert(keep.begin(), "dsagent");
  for (auto& a : keep) argv.push_back(a.data());
  AgentFlags f;
  EXPECT_EQ(ParseAgentFlags(static_cast<int>(argv.size()), argv.data(), &f),
            -1);
  return f;
}

std::string UsageError(const AgentFlags& f, const Getenv& env = Env({})) {
  auto s = ResolveStartup(f, env);
  EXPECT_FALSE(s.ok());
  if (s.ok()) return "";
  EXPECT_EQ(s.status().code(), StatusCode::kInvalidArgument);
  return s.status().message();
}

TEST(AgentStartup, ConnectWithTheSecretOnStdin) {
  auto s = ResolveStartup(Flags({"--connect", "10.0.0.7:29500", "--node_rank",
                                 "2", "--job_id", "ab12"}),
                          Env({}));
  ASSERT_TRUE(s.ok()) << s.status().message();
  EXPECT_EQ(s->kind, Startup::Kind::kAgent);
  EXPECT_EQ(s->options.launcher_host, "10.0.0.7");
  EXPECT_EQ(s->options.launcher_port, 29500);
  EXPECT_EQ(s->options.node_rank, 2);
  EXPECT_EQ(s->options.job_id, "ab12");
  EXPECT_TRUE(s->options.stdin_is_lifeline);
  EXPECT_FALSE(s->options.join);
  EXPECT_TRUE(s->options.secret.empty());  // read from stdin later
}

TEST(AgentStartup, OneCommandOnEveryNodeFindsItsNodeByName) {
  const auto f =
      Flags({"--connect", "h:1", "--job_id", "j", "--hosts", "n1,n2,n3",
             "--node_host_env", "SLURMD_NODENAME", "--secret_stdout"});
  auto s = ResolveStartup(f, Env({{"SLURMD_NODENAME", "n3"}}));
  ASSERT_TRUE(s.ok()) << s.status().message();
  EXPECT_EQ(s->options.node_rank, 2);
  EXPECT_TRUE(s->secret_stdout);
  EXPECT_NE(UsageError(f).find("--node_host_env SLURMD_NODENAME: not set"),
            std::string::npos);
  EXPECT_FALSE(
      ResolveStartup(f, Env({{"SLURMD_NODENAME", "n9"}})).ok());  // not listed
}

TEST(AgentStartup, BadCombinationsAreUsageErrorsNamingTheFlag) {
  EXPECT_NE(UsageError(Flags({"--connect", "h:1", "--job_id", "a b"}))
                .find("--job_id"),
            std::string::npos);
  EXPECT_NE(
      UsageError(Flags({"--connect", "h:0", "--job_id", "j"})).find("'h:0'"),
      std::string::npos);
  EXPECT_NE(UsageError(Flags({"--connect", "h:1", "--job_id", "j",
                              "--secret_file", "s"}))
                .find("go with --join"),
            std::string::npos);
  EXPECT_NE(UsageError(Flags({"--connect", "h:1", "--job_id", "j",
                              "--mpi_key_env", "K"}))
                .find("goes with --from_mpirun"),
            std::string::npos);
  EXPECT_NE(UsageError(Flags({"--connect", "h:1", "--job_id", "j",
                              "--from_mpirun", "--secret_stdout"}))
                .find("needs --mpi_key_env"),
            std::string::npos);
  // In a pod without --join: how to start it there.
  EXPECT_NE(UsageError(Flags({"--job_id", "j"}),
                       Env({{"KUBERNETES_SERVICE_HOST", "10.96.0.1"}}))
                .find("dsagent --join"),
            std::string::npos);
}

class AgentStartupJoin : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/dsl-startup-test-XXXXXX";
    dir_ = ::mkdtemp(tmpl);
    secret_ = dir_ + "/secret";
    std::ofstream(secret_) << "0123456789abcdef0123456789abcdef\n";
    std::filesystem::permissions(secret_,
                                 std::filesystem::perms::owner_read |
                                     std::filesystem::perms::owner_write);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::string dir_, secret_;
};

TEST_F(AgentStartupJoin, ClaimsItsNodeAndProvesTheSecretInTheFile) {
  auto s =
      ResolveStartup(Flags({"--join", "launcher.svc:29400", "--secret_file",
                            secret_, "--ready_file", dir_ + "/ready"}),
                     Env({{"JOB_COMPLETION_INDEX", "3"}}));
  ASSERT_TRUE(s.ok()) << s.status().message();
  const AgentOptions& o = s->options;
  EXPECT_TRUE(o.join);
  EXPECT_EQ(o.launcher_host, "launcher.svc");
  EXPECT_EQ(o.launcher_port, 29400);
  EXPECT_EQ(o.node_rank, 3);
  EXPECT_EQ(o.secret, "0123456789abcdef0123456789abcdef");
  EXPECT_FALSE(o.stdin_is_lifeline);
  EXPECT_EQ(o.connect_timeout_s, 600);
  EXPECT_EQ(o.ready_file, dir_ + "/ready");
  EXPECT_TRUE(TakeSecret(&*s));  // the file's; stdin is not read
  EXPECT_EQ(s->options.secret, "0123456789abcdef0123456789abcdef");
}

TEST_F(AgentStartupJoin, RefusesWhatCannotWork) {
  EXPECT_NE(UsageError(Flags({"--join", "l:1"})).find("needs --secret_file"),
            std::string::npos);
  EXPECT_NE(UsageError(Flags({"--join", "l:1", "--connect", "h:1",
                              "--secret_file", secret_}))
                .find("give one"),
            std::string::npos);
  EXPECT_NE(UsageError(Flags({"--join", "l:1", "--secret_file", secret_,
                              "--join_timeout", "0"}))
                .find("--join_timeout"),
            std::string::npos);
  EXPECT_NE(UsageError(Flags({"--join", "l:1", "--secret_file", secret_,
                              "--node_rank", "70000"}))
                .find("--node_rank must be in 0..65535"),
            std::string::npos);
  EXPECT_NE(UsageError(Flags({"--join", "l:1", "--secret_file", secret_,
                              "--ready_file", secret_}))
                .find("is not one an agent left"),
            std::string::npos);
  // A world-readable secret file is used, with a warning naming it.
  std::filesystem::permissions(secret_, std::filesystem::perms::others_read,
                               std::filesystem::perm_options::add);
  auto s = ResolveStartup(Flags({"--join", "l:1", "--secret_file", secret_}),
                          Env({}));
  ASSERT_TRUE(s.ok()) << s.status().message();
  ASSERT_FALSE(s->warnings.empty());
  EXPECT_NE(s->warnings[0].find(secret_), std::string::npos) << s->warnings[0];
}

// The pod's /tmp outlives its container: the probe files an agent that was
// killed left behind are the next agent's (a warning says so); any other
// file of that name is still refused.
TEST_F(AgentStartupJoin, TakesOverTheProbeFilesAKilledAgentLeft) {
  std::ofstream(dir_ + "/ready") << "node 2\n";
  std::ofstream(dir_ + "/alive") << "dsagent alive\n";
  auto s = ResolveStartup(
      Flags({"--join", "l:1", "--secret_file", secret_, "--ready_file",
             dir_ + "/ready", "--alive_file", dir_ + "/alive"}),
      Env({}));
  ASSERT_TRUE(s.ok()) << s.status().message();
  EXPECT_EQ(s->options.alive_file, dir_ + "/alive");
  EXPECT_FALSE(std::filesystem::exists(dir_ + "/ready"));
  EXPECT_FALSE(std::filesystem::exists(dir_ + "/alive"));
  std::vector<std::string> removed;
  for (const auto& w : s->warnings)
    if (w.find(": removed the one an earlier agent left") != std::string::npos)
      removed.push_back(w);
  ASSERT_EQ(removed.size(), 2u);
  EXPECT_EQ(removed[0].rfind("--ready_file " + dir_ + "/ready: ", 0), 0u)
      << removed[0];
  EXPECT_EQ(removed[1].rfind("--alive_file " + dir_ + "/alive: ", 0), 0u)
      << removed[1];

  std::ofstream(dir_ + "/notes") << "my notes\n";
  EXPECT_NE(UsageError(Flags({"--join", "l:1", "--secret_file", secret_,
                              "--alive_file", dir_ + "/notes"}))
                .find("is not one an agent left"),
            std::string::npos);
  EXPECT_TRUE(std::filesystem::exists(dir_ + "/notes"));
  EXPECT_NE(UsageError(Flags({"--join", "l:1", "--secret_file", secret_,
                              "--ready_file", dir_ + "/x", "--alive_file",
                              dir_ + "/x"}))
                .find("name one file"),
            std::string::npos);
  EXPECT_NE(UsageError(Flags({"--connect", "h:1", "--job_id", "j",
                              "--alive_file", dir_ + "/alive"}))
                .find("go with --join"),
            std::string::npos);
}

TEST(AgentStartup, UnderMpirunLocalRankZeroIsTheAgentTheOthersHold) {
  const auto f = Flags({"--connect", "h:1", "--job_id", "j", "--from_mpirun",
                        "--node_slots", "2,2", "--mpi_key_env",
                        "DSL_STARTUP_KEY", "--secret_stdout"});
  std::map<std::string, std::string> vars = {
      {"OMPI_COMM_WORLD_RANK", "3"},
      {"OMPI_COMM_WORLD_SIZE", "4"},
      {"OMPI_COMM_WORLD_LOCAL_RANK", "1"},
      {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"},
  };
  ASSERT_EQ(::setenv("DSL_STARTUP_KEY", "k1", 1), 0);
  auto holder = ResolveStartup(f, Env(vars));
  ASSERT_TRUE(holder.ok()) << holder.status().message();
  EXPECT_EQ(holder->kind, Startup::Kind::kMpiHolder);
  EXPECT_EQ(holder->placement.node_rank, 1);
  EXPECT_EQ(holder->mpi_key, "k1");
  EXPECT_EQ(std::getenv("DSL_STARTUP_KEY"), nullptr) << "the key is wiped";

  vars["OMPI_COMM_WORLD_RANK"] = "2";
  vars["OMPI_COMM_WORLD_LOCAL_RANK"] = "0";
  ASSERT_EQ(::setenv("DSL_STARTUP_KEY", "k2", 1), 0);
  auto node_agent = ResolveStartup(f, Env(vars));
  ASSERT_TRUE(node_agent.ok()) << node_agent.status().message();
  EXPECT_EQ(node_agent->kind, Startup::Kind::kAgent);
  EXPECT_EQ(node_agent->options.node_rank, 1);
  ASSERT_TRUE(node_agent->options.mpi.has_value());
  EXPECT_EQ(node_agent->options.mpi_key, "k2");
}

}  // namespace
}  // namespace dslaunch::agent
