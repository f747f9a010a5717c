#include "launcher/start/local_starter.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <stdlib.h>  // mkdtemp
#include <unistd.h>

#include <boost/asio/io_context.hpp>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <sstream>
#include <string>

#include "launcher/plan/hostfile.h"
#include "tests/common/run_until.h"

namespace dslaunch::launcher {
namespace {

using dslaunch::testing::RunUntil;

class Recorder : public Starter::Delegate {
 public:
  void OnAgentProcessExited(int node_rank, const std::string& how) override {
    exits[node_rank] = how;
  }
  void OnStarterOutput(const std::string&, std::string) override {}
  std::map<int, std::string> exits;
};

class LocalStarterTest : public ::testing::Test {
 protected:
  LocalStarterTest() {
    char tmpl[] = "/tmp/dsl-local-starter-XXXXXX";
    dir_ = ::mkdtemp(tmpl);
  }
  ~LocalStarterTest() override { std::filesystem::remove_all(dir_); }
  // Starts one "agent" for node 0: a shell script in place of dsagent.
  void StartAgent(LocalStarter& starter, const std::string& script,
                  const std::string& secret) {
    const std::string path = dir_ + "/agent.sh";
    std::ofstream(path) << "#!/bin/sh\n" << script << "\n";
    std::filesystem::permissions(path, std::filesystem::perms::owner_all);
    options_.agent_path = path;
    auto hostfile = ParseHostfile("127.0.0.1\n", "hosts");
    ASSERT_TRUE(hostfile.ok());
    auto plan = MakePlan(*hostfile, PlanOptions());
    ASSERT_TRUE(plan.ok());
    plan_ = *plan;
    starter.Start({&plan_, &options_, "job", secret, 1},
                  [this](StatusOr<Starter::Started> r) {
                    start_status_ = r.status();
                    started_ = true;
                  });
    ASSERT_TRUE(RunUntil(io_, [&] { return started_; }));
    ASSERT_TRUE(start_status_.ok()) << start_status_.message();
  }
  std::string Read(const std::string& name) {
    std::ifstream in(dir_ + "/" + name);
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
  }
  bool Exists(const std::string& name) {
    return std::filesystem::exists(dir_ + "/" + name);
  }

  boost::asio::io_context io_;
  Recorder rec_;
  std::string dir_;
  LaunchOptions options_;
  Plan plan_;
  bool started_ = false;
  Status start_status_;
};

TEST_F(LocalStarterTest, WritesTheSecretToStdinAndReportsTheExit) {
  auto starter = std::make_unique<LocalStarter>(io_, &rec_);
  StartAgent(*starter, "read s; [ \"$s\" = s3cret ] && exit 5; exit 1",
             "s3cret");
  ASSERT_TRUE(RunUntil(io_, [&] { return rec_.exits.count(0) == 1; }));
  EXPECT_EQ(rec_.exits[0], "exited with code 5");
}

TEST_F(LocalStarterTest, AgentLeadsItsOwnSessionAndKillReachesIt) {
  LocalStarter starter(io_, &rec_);
  // Field 6 of /proc/<pid>/stat is the session, field 1 the pid.
  const std::string f = dir_ + "/stat";
  StartAgent(starter,
             "read s; cat /proc/$$/stat > " + f + ".tmp; mv " + f + ".tmp " +
                 f + "; exec sleep 30",
             "x");
  ASSERT_TRUE(RunUntil(io_, [&] { return Exists("stat"); }));
  std::string stat = Read("stat");
  std::istringstream fields(stat.substr(stat.rfind(')') + 2));
  std::string state, ppid, pgrp, session;
  fields >> state >> ppid >> pgrp >> session;
  EXPECT_EQ(session, stat.substr(0, stat.find(' ')));
  EXPECT_NE(std::stoi(session), ::getsid(0));
  starter.Kill(0);
  ASSERT_TRUE(RunUntil(io_, [&] { return rec_.exits.count(0) == 1; }));
  EXPECT_NE(rec_.exits[0].find("SIGKILL"), std::string::npos) << rec_.exits[0];
}

TEST_F(LocalStarterTest, ClosesTheLifelineWhenItGoes) {
  // The agent reads its stdin to the end: only our going ends it.
  {
    LocalStarter starter(io_, &rec_);
    StartAgent(starter, "read s; cat >/dev/null; touch " + dir_ + "/eof", "x");
  }
  ASSERT_TRUE(RunUntil(io_, [&] { return Exists("eof"); }));
}

}  // namespace
}  // namespace dslaunch::launcher
