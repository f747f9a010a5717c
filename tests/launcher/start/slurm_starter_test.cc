#include "launcher/start/slurm_starter.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <stdlib.h>  // mkdtemp

#include <algorithm>
#include <boost/asio/io_context.hpp>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "launcher/plan/hostfile.h"
#include "tests/common/run_until.h"

namespace dslaunch::launcher {
namespace {

using Words = std::vector<std::string>;

TEST(SrunArgv, OneAgentPerNodeAsOneStepEachPrintingItsSecret) {
  SrunSettings s;
  s.extra_args = {"--cpu-bind=none", "-A", "proj"};
  const Words argv = SrunArgv(s, {"n1", "n2"}, {"n1", "n2"},
                              {"/opt/dsagent", "--connect", "10.0.0.9:4242",
                               "--node_rank", "0", "--job_id", "j"});
  EXPECT_EQ(argv, (Words{"srun",
                         "--nodes=2",
                         "--ntasks=2",
                         "--ntasks-per-node=1",
                         "--nodelist=n1,n2",
                         "--kill-on-bad-exit=1",
                         "--overlap",
                         "--input=none",
                         "--export=ALL",
                         "--job-name=dsagent",
                         "--cpu-bind=none",
                         "-A",
                         "proj",
                         "/opt/dsagent",
                         "--connect",
                         "10.0.0.9:4242",
                         "--job_id",
                         "j",
                         "--hosts",
                         "n1,n2",
                         "--node_host_env",
                         "SLURMD_NODENAME",
                         "--secret_stdout"}));
}

// A job that restarts keeps the step's other agents when one ends: the
// launcher stops every rank itself, and then starts the next generation.
TEST(SrunArgv, ARestartingJobsStepOutlivesOneAgent) {
  SrunSettings s;
  s.agents_outlive_a_peer = true;
  const Words argv = SrunArgv(s, {"n1"}, {"n1"}, {"/opt/dsagent"});
  EXPECT_NE(std::find(argv.begin(), argv.end(), "--kill-on-bad-exit=0"),
            argv.end());
  EXPECT_EQ(std::find(argv.begin(), argv.end(), "--kill-on-bad-exit=1"),
            argv.end());
}

// A lost node's agent started again: a step on that node alone, whose agent
// still finds its node rank among every host of the job.
TEST(SrunArgv, ALostNodesAgentRunsInAStepOnThatNodeAlone) {
  SrunSettings s;
  s.agents_outlive_a_peer = true;
  const Words argv = SrunArgv(s, {"n1", "n2", "n3"}, {"n3"},
                              {"/opt/dsagent", "--node_rank", "0"});
  auto has = [&](const std::string& w) {
    return std::find(argv.begin(), argv.end(), w) != argv.end();
  };
  EXPECT_TRUE(has("--nodes=1"));
  EXPECT_TRUE(has("--ntasks=1"));
  EXPECT_TRUE(has("--nodelist=n3"));
  EXPECT_TRUE(has("--overlap"));  // beside the first step, which goes on
  EXPECT_TRUE(has("n1,n2,n3"));   // --hosts
  EXPECT_FALSE(has("--node_rank"));
}

// srun's environment lasts the whole job, where a rank of the same user
// reads it: nothing is added to ours.
TEST(SrunSpec, AddsNothingToTheEnvironment) {
  const base::ProcessSpec spec = SrunSpec(SrunSettings(), {"n1"}, {"n1"},
                                          {"/opt/dsagent", "--job_id", "j"});
  EXPECT_TRUE(spec.inherit_env);
  EXPECT_TRUE(spec.env.empty());
  EXPECT_EQ(spec.argv.back(), "--secret_stdout");
  EXPECT_EQ(spec.destroy_signal, SIGTERM);
}

TEST(CheckSrunArgs, RefusesExportAndOutputWhichWouldWithholdTheAgentsNeeds) {
  SrunSettings s;
  s.extra_args = {"--cpu-bind=none", "--exclusive", "-O", "--overlap"};
  EXPECT_TRUE(CheckSrunArgs(s).ok());
  for (const char* word : {"--export=NONE", "--export", "--export=PATH",
                           "--output=x", "--output", "-o", "-ofile"}) {
    s.extra_args = {"-A", "proj", word};
    const Status st = CheckSrunArgs(s);
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << word;
    EXPECT_NE(st.message().find(word), std::string::npos) << st.message();
  }
}

TEST(ParseSrunLine, NamesTheNodeWhoseTaskEnded) {
  const Words hosts = {"n1", "n2"};
  SrunEvent e =
      ParseSrunLine("srun: error: n2: task 1: Exited with exit code 3", hosts);
  EXPECT_EQ(e.node, 1);
  EXPECT_EQ(e.how, "Exited with exit code 3");
  EXPECT_TRUE(e.cancelled.empty());
  e = ParseSrunLine("srun: error: n1: tasks 0-1: Killed", hosts);
  EXPECT_EQ(e.node, 0);
  EXPECT_EQ(e.how, "Killed");
  // Other hosts, other messages, and rank output are nothing of srun's.
  EXPECT_EQ(ParseSrunLine("srun: error: n9: task 1: Killed", hosts).node, -1);
  EXPECT_EQ(ParseSrunLine("srun: error: Unable to create step", hosts).node,
            -1);
  EXPECT_EQ(ParseSrunLine("srun: error: n1: task", hosts).node, -1);
  EXPECT_EQ(ParseSrunLine("[n1:0] srun: error: n1: task 0: x", hosts).node, -1);
}

TEST(ParseSrunLine, SaysWhenSlurmCancelledTheStepOrTheJob) {
  const Words hosts = {"n1"};
  EXPECT_EQ(ParseSrunLine("slurmstepd: error: *** STEP 12.0 ON n1 CANCELLED "
                          "AT 2026-11-24T10:00:00 ***",
                          hosts)
                .cancelled,
            "SLURM cancelled step 12.0 (scancel)");
  EXPECT_EQ(ParseSrunLine("slurmstepd: error: *** JOB 12 ON n1 CANCELLED AT "
                          "2026-11-24T10:00:00 DUE TO TIME LIMIT ***",
                          hosts)
                .cancelled,
            "SLURM cancelled job 12 (time limit)");
  EXPECT_TRUE(ParseSrunLine("*** nothing", hosts).cancelled.empty());
}

// A SlurmStarter over a fake srun (a shell script): each run writes its
// --nodelist to a file named after its pid and waits until told to end.
class SlurmStarterTest : public ::testing::Test, public Starter::Delegate {
 protected:
  SlurmStarterTest() {
    char tmpl[] = "/tmp/dsl-slurm-starter-XXXXXX";
    dir_ = ::mkdtemp(tmpl);
    const std::string srun = dir_ + "/srun";
    std::ofstream(srun) << "#!/bin/sh\n"
                        << "for a; do case $a in --nodelist=*) "
                        << "echo ${a#--nodelist=} >> " << dir_ << "/steps;; "
                        << "esac; done\n"
                        << "exec sleep 30\n";
    std::filesystem::permissions(srun, std::filesystem::perms::owner_all);
    settings_.srun = srun;
    auto hostfile = ParseHostfile("127.0.0.1\n127.0.0.2\n", "hosts");
    EXPECT_TRUE(hostfile.ok());
    plan_ = *MakePlan(*hostfile, PlanOptions());
  }
  ~SlurmStarterTest() override {
    starter_.reset();
    std::filesystem::remove_all(dir_);
  }
  void OnAgentProcessExited(int node, const std::string& how) override {
    exits[node].push_back(how);
  }
  void OnStarterOutput(const std::string&, std::string) override {}
  void Start() {
    starter_ = std::make_unique<SlurmStarter>(
        io_, this, settings_,
        std::vector<std::string>{"127.0.0.1", "127.0.0.2"});
    bool started = false;
    starter_->Start({&plan_, &options_, "job", "", 1},
                    [&](StatusOr<Starter::Started> r) {
                      EXPECT_TRUE(r.ok()) << r.status().message();
                      started = true;
                    });
    ASSERT_TRUE(testing::RunUntil(io_, [&] { return started; }));
    ASSERT_TRUE(testing::RunUntil(io_, [&] { return Steps().size() == 1; }));
  }
  std::vector<std::string> Steps() {
    std::ifstream in(dir_ + "/steps");
    std::vector<std::string> lines;
    for (std::string line; std::getline(in, line);) lines.push_back(line);
    return lines;
  }

  boost::asio::io_context io_;
  std::string dir_;
  SrunSettings settings_;
  LaunchOptions options_;
  Plan plan_;
  std::unique_ptr<SlurmStarter> starter_;
  std::map<int, std::vector<std::string>> exits;
};

// Under --max_restarts a node's agent in the first step is not ended with
// the step (the others' agents stay), nor counted ended before srun says so:
// a new agent must not start on a node where the old one may still run.
TEST_F(SlurmStarterTest, UnderRestartsKillLeavesTheFirstStepToTheOthers) {
  settings_.agents_outlive_a_peer = true;
  Start();
  EXPECT_EQ(Steps(), (std::vector<std::string>{"127.0.0.1,127.0.0.2"}));
  starter_->Kill(1);
  testing::RunUntil(
      io_, [] { return false; }, std::chrono::milliseconds(300));
  EXPECT_TRUE(exits.empty()) << "the first step goes on; node 1 not ended";
}

// A lost node's agent runs in a step of its own, which Kill ends alone.
TEST_F(SlurmStarterTest, ALostNodesAgentRunsInAStepOfItsOwn) {
  settings_.agents_outlive_a_peer = true;
  Start();
  EXPECT_TRUE(starter_->CanStartAgain());
  starter_->StartAgain(1);
  ASSERT_TRUE(testing::RunUntil(io_, [&] { return Steps().size() == 2; }));
  EXPECT_EQ(Steps()[1], "127.0.0.2");
  starter_->Kill(1);
  ASSERT_TRUE(testing::RunUntil(io_, [&] { return exits[1].size() == 1; }));
  EXPECT_NE(exits[1][0].find("ended with srun"), std::string::npos)
      << exits[1][0];
  EXPECT_TRUE(exits[0].empty()) << "the first step goes on";
}

// Without restarts the job ends with any agent: the step ends whole.
TEST_F(SlurmStarterTest, WithoutRestartsKillEndsTheWholeStep) {
  Start();
  starter_->Kill(1);
  ASSERT_TRUE(testing::RunUntil(
      io_, [&] { return exits[0].size() == 1 && exits[1].size() == 1; }));
  EXPECT_NE(exits[0][0].find("ended with srun"), std::string::npos);
}

}  // namespace
}  // namespace dslaunch::launcher
