// The Job's generations (--max_restarts) with a FakeStarter and fake agent
// links: what the agents are told, when the next generation starts, and
// what ends the job instead.
#include <gtest/gtest.h>
#include <signal.h>

#include <chrono>

#include "launcher/supervise/job.h"
#include "tests/launcher/supervise/job_fixture.h"

namespace dslaunch::launcher {
namespace {

class JobRestartTest : public job_testing::JobTest {
 protected:
  JobRestartTest() {
    options_.max_restarts = 2;
    options_.restart_backoff_s = 0;
  }
  // Runs the loop's ready handlers (the --restart_backoff timer).
  void Spin() {
    io_.restart();
    io_.run_for(std::chrono::milliseconds(30));
  }
  void GenerationEnded(int node, int free_port = 0) {
    wire::Envelope env;
    env.mutable_generation_ended()->set_free_port(free_port);
    job_->OnAgentMessage(node, std::move(env));
  }
  // Rank 3 exits `code`, the others are stopped, every agent ends the
  // generation (node 0 with `free_port`).
  void FailGeneration(int code, int free_port = 0) {
    RankExited(1, 3, code, 0);
    for (int r = 0; r < 3; ++r) RankExited(r / 2, r, 0, SIGTERM, 0, true);
    GenerationEnded(0, free_port);
    GenerationEnded(1);
  }
  // Node 1's agent is lost; node 0 stops its ranks and waits.
  void LoseNode1() {
    AgentGone(1);
    for (int r = 0; r < 2; ++r) RankExited(0, r, 0, SIGTERM, 0, true);
    GenerationEnded(0);
  }
  int JobSpecs(int node) {
    int n = 0;
    for (const auto& m : links_.sent[node])
      n += m.msg_case() == wire::Envelope::kJobSpec;
    return n;
  }
};

TEST_F(JobRestartTest, AFailedRankRestartsTheJobOnTheSameAgents) {
  options_.master_port_given = false;
  StartJob();
  starter_.Finish(Starter::Started{});
  Authenticate(0, 41000);
  Authenticate(1);
  for (int r = 0; r < 4; ++r) RankStarted(r / 2, r);
  EXPECT_EQ(links_.Last(0).job_spec().restart_count(), 0);
  EXPECT_EQ(links_.Last(0).job_spec().max_restarts(), 2);
  RankExited(1, 3, 7, 0);
  // The agents stop the ranks and stay.
  ASSERT_EQ(links_.Last(0).msg_case(), wire::Envelope::kAbort);
  EXPECT_TRUE(links_.Last(0).abort().restart());
  EXPECT_TRUE(links_.Last(1).abort().restart());
  for (int r = 0; r < 3; ++r) RankExited(r / 2, r, 0, SIGTERM, 0, true);
  GenerationEnded(0, 42000);
  Spin();
  EXPECT_EQ(JobSpecs(0), 1);  // node 1 has not ended its generation yet
  GenerationEnded(1);
  Spin();
  ASSERT_EQ(JobSpecs(0), 2);
  ASSERT_EQ(JobSpecs(1), 2);
  for (int node : {0, 1}) {
    const wire::JobSpec& spec = links_.Last(node).job_spec();
    EXPECT_EQ(spec.restart_count(), 1);
    EXPECT_EQ(spec.max_restarts(), 2);
    EXPECT_EQ(spec.master_port(), 42000);  // node 0's fresh free port
    EXPECT_EQ(spec.ranks_size(), 2);
  }
  EXPECT_EQ(phase(), Phase::kStarting);
  EXPECT_EQ(job_->restarts(), 1);
  EXPECT_EQ(console_->board().restarts(), 1);
  EXPECT_FALSE(starter_.stopping);  // nothing of the start was ended
  EXPECT_TRUE(starter_.killed.empty());
  for (int r = 0; r < 4; ++r) RankStarted(r / 2, r);
  EXPECT_EQ(phase(), Phase::kRunning);
  for (int r = 0; r < 4; ++r) RankExited(r / 2, r, 0, 0);
  EXPECT_EQ(links_.Last(0).msg_case(), wire::Envelope::kShutdown);
  AgentGone(0);
  AgentGone(1);
  EXPECT_EQ(job_->Finish(), 0);
  const std::string report = Report();
  EXPECT_NE(report.find("rank 3 on 127.0.0.2 exited with code 7; stopping "
                        "every rank, then restart 1 of 2"),
            std::string::npos)
      << report;
  EXPECT_NE(report.find("generation 0 on 2 nodes (127.0.0.1, 127.0.0.2): "
                        "rank 3 on 127.0.0.2 exited with code 7"),
            std::string::npos)
      << report;
  EXPECT_NE(report.find("all 4 ranks on 2 nodes exited 0"), std::string::npos);
  EXPECT_NE(report.find("after 1 restart)"), std::string::npos) << report;
}

TEST_F(JobRestartTest, TheLastGenerationsFailureIsTheExitStatus) {
  StartJob();
  starter_.Finish(Starter::Started{});
  RunAll();
  FailGeneration(5);
  Spin();
  for (int r = 0; r < 4; ++r) RankStarted(r / 2, r);
  FailGeneration(6);
  Spin();
  EXPECT_EQ(job_->restarts(), 2);
  for (int r = 0; r < 4; ++r) RankStarted(r / 2, r);
  RankExited(1, 3, 9, 0);
  // The budget is spent: this stop ends the job.
  ASSERT_EQ(links_.Last(0).msg_case(), wire::Envelope::kAbort);
  EXPECT_FALSE(links_.Last(0).abort().restart());
  for (int r = 0; r < 3; ++r) RankExited(r / 2, r, 0, SIGTERM, 0, true);
  AgentGone(0);
  AgentGone(1);
  EXPECT_EQ(phase(), Phase::kEnded);
  EXPECT_EQ(job_->Finish(), 9);
  EXPECT_EQ(JobSpecs(0), 3);
  const std::string report = Report();
  EXPECT_NE(report.find("generation 1 on 2 nodes"), std::string::npos);
  EXPECT_NE(report.find("FAILED: rank 3 on 127.0.0.2"), std::string::npos);
}

TEST_F(JobRestartTest, CtrlCDuringTheBackoffEndsTheJobWith130) {
  options_.restart_backoff_s = 60;
  StartJob();
  starter_.Finish(Starter::Started{});
  RunAll();
  FailGeneration(5);
  Spin();
  EXPECT_EQ(JobSpecs(0), 1);  // waiting out the backoff
  job_->OnSignal(SIGINT);
  ASSERT_EQ(links_.Last(0).msg_case(), wire::Envelope::kAbort);
  EXPECT_FALSE(links_.Last(0).abort().restart());  // idle agents exit
  EXPECT_FALSE(links_.Last(1).abort().restart());
  AgentGone(0);
  AgentGone(1);
  EXPECT_EQ(phase(), Phase::kEnded);
  EXPECT_EQ(job_->Finish(), 130);
  EXPECT_EQ(JobSpecs(0), 1);
  const std::string report = Report();
  EXPECT_NE(report.find("stopped: interrupted by the user (SIGINT)"),
            std::string::npos)
      << report;
  EXPECT_NE(report.find("generation 0 on 2 nodes"), std::string::npos);
  EXPECT_EQ(report.find("stopped in consequence"), std::string::npos);
}

TEST_F(JobRestartTest, ALostAgentThatCannotBeStartedAgainEndsTheJobWith69) {
  StartJob();
  starter_.Finish(Starter::Started{});
  RunAll();
  RankExited(1, 3, 5, 0);
  for (int r = 0; r < 3; ++r) RankExited(r / 2, r, 0, SIGTERM, 0, true);
  GenerationEnded(0);
  AgentGone(1);  // before it ended its generation
  EXPECT_FALSE(links_.Last(0).abort().restart());
  Spin();
  EXPECT_EQ(JobSpecs(0), 1);
  AgentGone(0);
  EXPECT_EQ(phase(), Phase::kEnded);
  EXPECT_EQ(job_->Finish(), 69);
  const std::string report = Report();
  EXPECT_NE(report.find("node 1 (127.0.0.2) was lost (its agent's connection "
                        "ended (closed)), and this start mode cannot start its "
                        "agent again"),
            std::string::npos)
      << report;
  EXPECT_NE(report.find("generation 0 on 2 nodes"), std::string::npos);
  EXPECT_TRUE(starter_.stopping);
}

TEST_F(JobRestartTest, ALostAgentIsStartedAgainAndTheJobGoesOnWithIt) {
  options_.master_port_given = false;
  starter_.can_start_again = true;
  StartJob();
  starter_.Finish(Starter::Started{});
  Authenticate(0, 41000);
  Authenticate(1);
  for (int r = 0; r < 4; ++r) RankStarted(r / 2, r);
  job_->OnAgentDisconnected(0, Status::Ok());  // node 0's agent is lost
  EXPECT_TRUE(links_.Last(1).abort().restart());
  RankExited(1, 2, 0, SIGTERM, 0, true);
  RankExited(1, 3, 0, SIGTERM, 0, true);
  GenerationEnded(1);
  EXPECT_TRUE(starter_.started_again.empty());  // its process still runs
  job_->OnAgentProcessExited(0, "was killed by SIGKILL");
  EXPECT_EQ(starter_.started_again, std::vector<int>{0});
  EXPECT_NE(phase(), Phase::kEnded);
  Spin();
  EXPECT_EQ(JobSpecs(1), 1);  // waits for node 0
  Authenticate(0, 43000);     // its new agent
  Spin();
  ASSERT_EQ(JobSpecs(1), 2);
  ASSERT_TRUE(Got(0, wire::Envelope::kJobSpec));
  EXPECT_EQ(links_.Last(0).job_spec().restart_count(), 1);
  EXPECT_EQ(links_.Last(1).job_spec().master_port(), 43000);
  for (int r = 0; r < 4; ++r) RankStarted(r / 2, r);
  for (int r = 0; r < 4; ++r) RankExited(r / 2, r, 0, 0);
  AgentGone(0);
  AgentGone(1);
  EXPECT_EQ(job_->Finish(), 0);
  const std::string report = Report();
  EXPECT_NE(report.find("starting the agent of node 0 (127.0.0.1) again"),
            std::string::npos)
      << report;
  EXPECT_NE(report.find("node 0 (127.0.0.1) is back"), std::string::npos);
}

// pdsh and srun: an agent makes its node's secret and the tool relays it,
// through pipes a rank of the same user can read. A lost node's agent is
// started again only once no rank runs, its new secret is taken (not a
// "second claim"), and the next generation waits until it is spent.
TEST_F(JobRestartTest, AnAgentThatMakesItsSecretStartsAgainOnlyOnceNoRankRuns) {
  starter_.can_start_again = true;
  starter_.makes_secrets = true;
  StartJob();
  starter_.Finish(Starter::Started{});
  job_->OnAgentSecret(0, "first0");
  job_->OnAgentSecret(1, "first1");
  RunAll();
  AgentGone(0);  // node 1's ranks still run
  EXPECT_TRUE(starter_.started_again.empty());
  EXPECT_EQ(job_->NodeSecret(0), "") << "its agent is gone: proves nothing";
  RankExited(1, 2, 0, SIGTERM, 0, true);
  EXPECT_TRUE(starter_.started_again.empty());
  RankExited(1, 3, 0, SIGTERM, 0, true);
  GenerationEnded(1);
  EXPECT_EQ(starter_.started_again, std::vector<int>{0});
  job_->OnAgentSecret(0, "second0");  // the new agent's, as relayed
  EXPECT_EQ(job_->NodeSecret(0), "second0");
  EXPECT_NE(phase(), Phase::kEnded) << "not taken for a second claim";
  Spin();
  EXPECT_EQ(JobSpecs(1), 1);  // waits for node 0
  Authenticate(0);
  EXPECT_EQ(job_->NodeSecret(0), "") << "spent";
  Spin();
  EXPECT_EQ(JobSpecs(0), 2);
  EXPECT_EQ(JobSpecs(1), 2);
  // A second line for it now is not its agent's: ignored.
  job_->OnAgentSecret(0, "third0");
  EXPECT_EQ(job_->NodeSecret(0), "");
  EXPECT_NE(phase(), Phase::kEnded);
}

TEST_F(JobRestartTest, NodesNotBackWithinTheRejoinTimeoutEndTheJobWith69) {
  starter_.can_start_again = true;
  options_.rejoin_timeout_s = 0;
  StartJob();
  starter_.Finish(Starter::Started{});
  RunAll();
  LoseNode1();
  Spin();
  EXPECT_FALSE(links_.Last(0).abort().restart());  // node 0's agent exits
  ASSERT_FALSE(starter_.killed.empty());
  EXPECT_EQ(starter_.killed.back(), 1);  // the one started again
  job_->OnAgentProcessExited(1, "was killed by SIGKILL");
  AgentGone(0);
  EXPECT_EQ(phase(), Phase::kEnded);
  EXPECT_EQ(job_->Finish(), 69);
  EXPECT_NE(Report().find("not enough nodes within --rejoin_timeout 0 s; "
                          "missing: 127.0.0.2"),
            std::string::npos);
}

TEST_F(JobRestartTest, ANodeLostTwiceWithinTheCooldownEndsTheJobAtOnce) {
  starter_.can_start_again = true;
  options_.node_cooldown_s = 600;
  StartJob();
  starter_.Finish(Starter::Started{});
  RunAll();
  LoseNode1();
  ASSERT_EQ(starter_.started_again, std::vector<int>{1});
  Authenticate(1);
  Spin();
  for (int r = 0; r < 4; ++r) RankStarted(r / 2, r);
  LoseNode1();  // again, within the cooldown
  EXPECT_EQ(starter_.started_again, std::vector<int>{1});  // not again
  AgentGone(0);
  EXPECT_EQ(phase(), Phase::kEnded);
  EXPECT_EQ(job_->Finish(), 69);
  EXPECT_NE(Report().find("not enough nodes: excluded for --node_cooldown 600 "
                          "s (lost twice within it): 127.0.0.2"),
            std::string::npos);
}

TEST_F(JobRestartTest, EachGenerationStartsWithAnEmptyStore) {
  StartJob();
  starter_.Finish(Starter::Started{});
  RunAll();
  auto store = [&](wire::StoreRequest::Op op, const std::string& key) {
    wire::Envelope env;
    auto* r = env.mutable_store_request();
    r->set_id(static_cast<uint64_t>(links_.sent[0].size()) + 1);
    r->set_op(op);
    r->add_keys(key);
    r->set_value("v");
    job_->OnAgentMessage(0, std::move(env));
    return links_.Last(0);
  };
  EXPECT_TRUE(store(wire::StoreRequest::SET, "rdzv").store_response().ok());
  EXPECT_TRUE(
      store(wire::StoreRequest::CHECK, "rdzv").store_response().ready());
  FailGeneration(5);
  Spin();
  ASSERT_EQ(JobSpecs(0), 2);
  EXPECT_FALSE(
      store(wire::StoreRequest::CHECK, "rdzv").store_response().ready());
}

TEST_F(JobRestartTest, AGivenMasterPortIsKeptInEveryGeneration) {
  options_.master_port_given = true;
  plan_.master_port = 29511;
  StartJob();
  starter_.Finish(Starter::Started{});
  RunAll();
  FailGeneration(5, /*free_port=*/43000);
  Spin();
  ASSERT_EQ(JobSpecs(0), 2);
  EXPECT_EQ(links_.Last(0).job_spec().master_port(), 29511);
}

}  // namespace
}  // namespace dslaunch::launcher
