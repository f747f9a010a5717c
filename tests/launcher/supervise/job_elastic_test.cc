// --num_nodes MIN:MAX with a FakeStarter and fake agent links: spares stand
// by and take a lost node's place, a generation shrinks to the healthy
// nodes (ranks renumbered densely) and grows back when a node returns, and
// fewer than MIN nodes end the job with 69.
#include <gtest/gtest.h>
#include <signal.h>

#include <chrono>

#include "launcher/supervise/job.h"
#include "tests/launcher/supervise/job_fixture.h"

namespace dslaunch::launcher {
namespace {

// `hosts` hosts of 2 slots; --num_nodes min:max.
Plan Elastic(int hosts, int min, int max) {
  std::string text;
  for (int h = 0; h < hosts; ++h)
    text += "10.0.0." + std::to_string(h + 1) + " slots=2\n";
  auto hostfile = ParseHostfile(text, "hosts");
  EXPECT_TRUE(hostfile.ok());
  PlanOptions options;
  options.num_nodes = max;
  options.min_nodes = min;
  auto plan = MakePlan(*hostfile, options);
  EXPECT_TRUE(plan.ok()) << plan.status().message();
  return *plan;
}

class JobElasticTest : public job_testing::JobTest {
 protected:
  JobElasticTest() {
    options_.max_restarts = 3;
    options_.restart_backoff_s = 0;
    options_.join_settle_s = 0;
    starter_.can_start_again = true;
  }
  void Spin() {
    io_.restart();
    io_.run_for(std::chrono::milliseconds(30));
  }
  void GenerationEnded(int agent) {
    wire::Envelope env;
    env.mutable_generation_ended()->set_free_port(43000 + agent);
    job_->OnAgentMessage(agent, std::move(env));
  }
  // The agent's JobSpecs so far.
  std::vector<wire::JobSpec> Specs(int agent) {
    std::vector<wire::JobSpec> specs;
    for (const auto& m : links_.sent[agent])
      if (m.has_job_spec()) specs.push_back(m.job_spec());
    return specs;
  }
  bool StoodBy(int agent) {
    for (const auto& m : links_.sent[agent])
      if (m.has_abort() && m.abort().restart()) return true;
    return false;
  }
  // Every agent of `agents` starts the ranks of its last JobSpec.
  void StartRanks(const std::vector<int>& agents) {
    for (int a : agents) {
      const wire::JobSpec spec = Specs(a).back();
      for (const auto& r : spec.ranks()) RankStarted(a, r.rank());
    }
  }
  // Three nodes' agents in, every rank of the first generation running.
  void RunOnThree() {
    StartJob();
    starter_.Finish(Starter::Started{});
    for (int a = 0; a < 3; ++a) Authenticate(a);
    StartRanks({0, 1, 2});
  }
  // `lost` is lost; the others stop their ranks and end the generation.
  void Lose(int lost, const std::vector<int>& others) {
    AgentGone(lost);
    for (int a : others) {
      const wire::JobSpec spec = Specs(a).back();
      for (const auto& r : spec.ranks())
        RankExited(a, r.rank(), 0, SIGTERM, 0, true);
      GenerationEnded(a);
    }
  }
};

TEST_F(JobElasticTest, ASpareStandsByAndTakesALostNodesPlace) {
  plan_ = Elastic(4, 3, 3);          // 3 nodes, host 4 a spare
  starter_.can_start_again = false;  // node 1 cannot come back
  options_.master_port_given = false;
  options_.max_restarts = 1;
  StartJob();
  starter_.Finish(Starter::Started{});
  for (int a = 0; a < 4; ++a) Authenticate(a, 42000 + a);
  // The spare is told to stand by, never given ranks.
  EXPECT_TRUE(StoodBy(3));
  EXPECT_TRUE(Specs(3).empty());
  GenerationEnded(3);
  ASSERT_EQ(Specs(0).size(), 1u);
  EXPECT_EQ(Specs(2).back().world_size(), 6);
  StartRanks({0, 1, 2});
  EXPECT_EQ(phase(), Phase::kRunning);
  // A stop that restarts leaves the spare be.
  const size_t to_spare = links_.sent[3].size();
  Lose(1, {0, 2});
  EXPECT_EQ(links_.sent[3].size(), to_spare);
  Spin();
  // The next generation: agents 0, 2 and the spare, renumbered.
  ASSERT_EQ(Specs(3).size(), 1u);
  const wire::JobSpec spare = Specs(3).back();
  EXPECT_EQ(spare.node_rank(), 2);
  EXPECT_EQ(spare.num_nodes(), 3);
  EXPECT_EQ(spare.world_size(), 6);
  EXPECT_EQ(spare.ranks(0).rank(), 4);
  EXPECT_EQ(spare.host(), "10.0.0.4");
  EXPECT_EQ(spare.restart_count(), 1);
  EXPECT_EQ(Specs(2).back().node_rank(), 1);
  EXPECT_EQ(Specs(2).back().ranks(0).rank(), 2);
  EXPECT_EQ(Specs(0).back().master_port(), 43000);  // node 0's free port now
  EXPECT_EQ(Specs(1).size(), 1u);
  StartRanks({0, 2, 3});
  EXPECT_EQ(phase(), Phase::kRunning);
  EXPECT_EQ(job_->state().members(), 3);
  // A failure on the spare, now node rank 2, is reported as such.
  RankExited(3, 4, 9, 0);  // the one restart is spent: the job ends
  EXPECT_FALSE(job_->state().restart_pending());
  for (int a : {0, 2, 3}) AgentGone(a);
  EXPECT_EQ(job_->Finish(), 9);
  EXPECT_NE(Report().find("FAILED: rank 4 on 10.0.0.4 (node 2, local rank 0"),
            std::string::npos)
      << Report();
}

TEST_F(JobElasticTest,
       TheJobShrinksToTheHealthyNodesAndGrowsBackWhenOneReturns) {
  plan_ = Elastic(3, 2, 3);
  options_.max_restarts = 1;  // growing spends none of it
  RunOnThree();
  Lose(1, {0, 2});
  EXPECT_EQ(starter_.started_again, std::vector<int>{1});
  Spin();  // --join_settle 0: no waiting for node 1 with 2 of MIN 2 ready
  ASSERT_EQ(Specs(2).size(), 2u);
  EXPECT_EQ(Specs(2).back().node_rank(), 1);
  EXPECT_EQ(Specs(2).back().num_nodes(), 2);
  EXPECT_EQ(Specs(2).back().world_size(), 4);
  EXPECT_EQ(Specs(2).back().ranks(0).rank(), 2);
  EXPECT_EQ(Specs(0).back().world_size(), 4);
  StartRanks({0, 2});
  EXPECT_EQ(phase(), Phase::kRunning);
  EXPECT_EQ(job_->state().failure_restarts(), 1);
  // Node 1's new agent comes: it stands by, and the job grows back to 3.
  Authenticate(1);
  EXPECT_TRUE(StoodBy(1));
  GenerationEnded(1);
  EXPECT_EQ(phase(), Phase::kStopping);
  EXPECT_TRUE(job_->state().restart_pending());  // no budget needed
  EXPECT_EQ(job_->state().outcome().cause, Outcome::Cause::kGrow);
  for (int a : {0, 2}) {
    const wire::JobSpec spec = Specs(a).back();
    for (const auto& r : spec.ranks())
      RankExited(a, r.rank(), 0, SIGTERM, 0, true);
    GenerationEnded(a);
  }
  Spin();
  ASSERT_EQ(Specs(1).size(), 2u);
  for (int a = 0; a < 3; ++a) {
    EXPECT_EQ(Specs(a).back().node_rank(), a);
    EXPECT_EQ(Specs(a).back().world_size(), 6);
    EXPECT_EQ(Specs(a).back().restart_count(), 2);
  }
  EXPECT_EQ(job_->state().restarts(), 2);
  EXPECT_EQ(job_->state().failure_restarts(), 1);
  StartRanks({0, 1, 2});
  for (int r = 0; r < 6; ++r) RankExited(r / 2, r, 0, 0);
  EXPECT_EQ(job_->state().ExitStatus(), 0);
  const std::string report = Report();
  EXPECT_NE(report.find("restart 1 of 1 (0."), std::string::npos) << report;
  EXPECT_NE(report.find("2 nodes (10.0.0.1, 10.0.0.3), 4 ranks (was 6)"),
            std::string::npos)
      << report;
  EXPECT_NE(report.find("node 1 (10.0.0.2) stands by: the job grows from 2 "
                        "to 3 nodes"),
            std::string::npos)
      << report;
  EXPECT_NE(report.find("restart 2, which grows the job"), std::string::npos)
      << report;
}

// pdsh and srun: the next generation could start on two nodes at once, but
// the lost node's agent was started again with a secret of its own in the
// tool's pipe: no rank runs until that agent is in or has ended, and no
// further attempt starts meanwhile.
TEST_F(JobElasticTest, NoRankRunsWhileAnAgentStartedAgainHasItsSecretOut) {
  plan_ = Elastic(3, 2, 3);
  starter_.makes_secrets = true;
  RunOnThree();
  Lose(1, {0, 2});
  EXPECT_EQ(starter_.started_again, std::vector<int>{1});
  Spin();
  EXPECT_EQ(Specs(0).size(), 1u) << "held for node 1's secret";
  job_->OnAgentSecret(1, "fresh");
  Spin();
  EXPECT_EQ(Specs(0).size(), 1u);
  job_->OnAgentProcessExited(1, "exited with exit code 255");  // never in
  EXPECT_EQ(job_->NodeSecret(1), "");
  Spin();
  ASSERT_EQ(Specs(0).size(), 2u);
  EXPECT_EQ(Specs(0).back().world_size(), 4);
  EXPECT_TRUE(Specs(1).size() == 1u);
  EXPECT_EQ(starter_.started_again, std::vector<int>{1});
  StartRanks({0, 2});
  EXPECT_EQ(phase(), Phase::kRunning);
  // While ranks run, no agent that makes a secret is started.
  io_.restart();
  io_.run_for(std::chrono::milliseconds(5200));
  EXPECT_EQ(starter_.started_again, std::vector<int>{1});
}

// pdsh and srun: the nodes' JobSpecs wait for the spare's secret to be
// spent; a spare whose agent comes in last lets them go (found by the pdsh
// cluster test, which hung once in four when it did).
TEST_F(JobElasticTest, WhereAgentsMakeSecretsASpareInLastLetsTheJobStart) {
  plan_ = Elastic(4, 3, 3);
  starter_.makes_secrets = true;
  StartJob();
  starter_.Finish(Starter::Started{});
  for (int a = 0; a < 3; ++a) Authenticate(a);
  EXPECT_TRUE(Specs(0).empty()) << "the spare's secret is still out";
  Authenticate(3);
  EXPECT_TRUE(StoodBy(3));
  for (int a = 0; a < 3; ++a) EXPECT_EQ(Specs(a).size(), 1u) << a;
  EXPECT_TRUE(Specs(3).empty());
}

// An agent started again that neither connects nor ends (a step SLURM keeps
// pending) does not hold the next generation for ever: after
// --start_timeout it is killed, and the job goes on.
TEST_F(JobElasticTest,
       AnAgentStartedAgainThatHangsIsKilledAfterTheStartTimeout) {
  plan_ = Elastic(3, 2, 3);
  starter_.makes_secrets = true;
  options_.start_timeout_s = 0.05;
  RunOnThree();
  Lose(1, {0, 2});
  EXPECT_EQ(starter_.started_again, std::vector<int>{1});
  const size_t kills = starter_.killed.size();
  io_.restart();
  io_.run_for(std::chrono::milliseconds(1200));
  ASSERT_GT(starter_.killed.size(), kills);
  EXPECT_EQ(starter_.killed.back(), 1);
  EXPECT_EQ(Specs(0).size(), 1u) << "still held: its end is not known";
  job_->OnAgentProcessExited(1, "ended with srun, which was killed by SIGKILL");
  Spin();
  ASSERT_EQ(Specs(0).size(), 2u);
  EXPECT_EQ(Specs(0).back().world_size(), 4);
}

TEST_F(JobElasticTest, ANodeThatReturnsWithinTheSettleKeepsTheJobWhole) {
  plan_ = Elastic(3, 2, 3);
  options_.join_settle_s = 60;
  RunOnThree();
  Lose(1, {0, 2});
  Spin();
  EXPECT_EQ(Specs(0).size(), 1u);  // 2 of 3 ready: waiting for the third
  Authenticate(1);
  GenerationEnded(1);
  Spin();
  ASSERT_EQ(Specs(1).size(), 2u);
  EXPECT_EQ(Specs(1).back().node_rank(), 1);
  EXPECT_EQ(Specs(1).back().world_size(), 6);
}

TEST_F(JobElasticTest, FewerThanMinNodesEndTheJobWith69NamingTheMissing) {
  plan_ = Elastic(3, 2, 3);
  options_.rejoin_timeout_s = 0;
  RunOnThree();
  AgentGone(2);
  Lose(1, {0});
  Spin();
  EXPECT_EQ(Specs(0).size(), 1u);
  EXPECT_EQ(phase(), Phase::kStopping);
  // The agents started again are killed (last); the one left ends.
  ASSERT_GE(starter_.killed.size(), 2u);
  EXPECT_EQ(std::vector<int>(starter_.killed.end() - 2, starter_.killed.end()),
            (std::vector<int>{1, 2}));
  for (int a : {1, 2}) job_->OnAgentProcessExited(a, "was killed");
  AgentGone(0);
  EXPECT_EQ(phase(), Phase::kEnded);
  EXPECT_EQ(job_->Finish(), 69);
  EXPECT_NE(Report().find("not enough nodes (at least 2 needed, 1 ready) "
                          "within --rejoin_timeout 0 s; missing: 10.0.0.2"),
            std::string::npos)
      << Report();
}

TEST_F(JobElasticTest, ASpareLostWhileTheJobRunsStopsNothing) {
  plan_ = Elastic(3, 2, 2);
  StartJob();
  starter_.Finish(Starter::Started{});
  for (int a = 0; a < 3; ++a) Authenticate(a);
  GenerationEnded(2);
  StartRanks({0, 1});
  AgentGone(2);
  EXPECT_EQ(phase(), Phase::kRunning);
  EXPECT_EQ(starter_.started_again, std::vector<int>{2});  // started again
  for (int r = 0; r < 4; ++r) RankExited(r / 2, r, 0, 0);
  EXPECT_EQ(phase(), Phase::kStopping);
  // Its new agent, on its way, is killed with the job's end.
  ASSERT_FALSE(starter_.killed.empty());
  EXPECT_EQ(starter_.killed.back(), 2);
}

}  // namespace
}  // namespace dslaunch::launcher
