// The Job under --launcher join: the plan is made from the agents that
// come, once all have; a node may leave and join again while it assembles.
#include <gtest/gtest.h>
#include <signal.h>

#include "tests/common/run_until.h"
#include "tests/launcher/supervise/job_fixture.h"

namespace dslaunch::launcher {
namespace {

using job_testing::JobTest;

// --launcher join: the plan is made from the agents once all have joined.
class JoinJobTest : public JobTest {
 protected:
  JoinJobTest() {
    options_.launcher = "join";
    options_.master_port_given = false;
    // Until they join: two "join-N" nodes of one rank each.
    plan_ = JoinPlan({"join-0", "join-1"}, {1, 1}, PlanOptions());
  }
  void Join(int node, const std::string& host, int gpus,
            const std::string& addr, int free_port = 0) {
    wire::Hello hello;
    hello.set_node_rank(node);
    hello.mutable_facts()->set_hostname(host);
    for (int g = 0; g < gpus; ++g) hello.mutable_facts()->add_gpus(g);
    hello.mutable_facts()->set_free_port(free_port);
    job_->OnAgentAuthenticated(node, hello, addr);
  }
};

TEST_F(JoinJobTest, PlansFromTheJoinedAgentsAndOnlyThenSendsTheJob) {
  StartJob();
  starter_.Finish(Starter::Started{});
  Join(1, "train-worker-1", 0, "10.9.0.12");
  EXPECT_FALSE(links_.sent.count(1)) << "no job before every node joined";
  Join(0, "train-worker-0", 3, "10.9.0.11", 40123);
  ASSERT_TRUE(links_.sent.count(0) && links_.sent.count(1));
  const wire::JobSpec& zero = links_.Last(0).job_spec();
  const wire::JobSpec& one = links_.Last(1).job_spec();
  // Node 0 has 3 GPUs, node 1 none (one rank).
  EXPECT_EQ(zero.world_size(), 4);
  EXPECT_EQ(zero.ranks_size(), 3);
  EXPECT_EQ(one.ranks_size(), 1);
  EXPECT_EQ(one.ranks(0).rank(), 3);
  EXPECT_EQ(zero.host(), "train-worker-0");
  EXPECT_EQ(one.master_addr(), "10.9.0.11");
  EXPECT_EQ(one.master_port(), 40123);
  EXPECT_EQ(job_->plan().nodes[1].host, "train-worker-1");
  for (int r = 0; r < 3; ++r) RankStarted(0, r);
  RankStarted(1, 3);
  EXPECT_EQ(phase(), Phase::kRunning);
}

TEST_F(JoinJobTest, NumGpusDecidesTheRanksPerNode) {
  options_.plan.num_gpus = 2;
  plan_ = JoinPlan({"join-0", "join-1"}, {2, 2}, options_.plan);
  StartJob();
  starter_.Finish(Starter::Started{});
  Join(0, "a", 8, "10.9.0.11");
  Join(1, "b", 0, "10.9.0.12");
  EXPECT_EQ(links_.Last(0).job_spec().world_size(), 4);
  EXPECT_EQ(links_.Last(1).job_spec().ranks_size(), 2);
}

TEST_F(JoinJobTest, AnAgentClaimingTooManyGpusFailsTheStartAndEveryAgentHears) {
  StartJob();
  starter_.Finish(Starter::Started{});
  Join(0, "a", 5000, "10.9.0.11");
  Join(1, "b", 0, "10.9.0.12");
  for (int n : {0, 1}) {
    ASSERT_TRUE(links_.sent.count(n));
    EXPECT_TRUE(links_.Last(n).has_abort()) << n;
    EXPECT_NE(links_.Last(n).abort().reason().find("5000 GPUs"),
              std::string::npos);
    EXPECT_NE(links_.Last(n).abort().exit_status(), 0);
  }
  EXPECT_TRUE(links_.shut_down);
}

TEST_F(JoinJobTest, AHostileHostnameReachesTheConsoleEscaped) {
  StartJob();
  starter_.Finish(Starter::Started{});
  Join(0, "evil\x1b[31m\nFAKE", 0, "10.9.0.11");
  Join(1, "b", 0, "10.9.0.12");
  EXPECT_EQ(job_->plan().nodes[0].host.find('\x1b'), std::string::npos);
  EXPECT_EQ(job_->plan().nodes[0].host.find('\n'), std::string::npos);
}

// Node 0 joins and drops before node 1 comes: the job is still assembling,
// so it waits for node 0 again instead of failing before anything ran.
TEST_F(JoinJobTest, ANodeThatLeavesBeforeTheJobAssembledMayJoinAgain) {
  StartJob();
  starter_.Finish(Starter::Started{});
  Join(0, "pod-0", 0, "10.9.0.11");
  job_->OnAgentDisconnected(0, Unavailable("connection reset"));
  EXPECT_EQ(phase(), Phase::kStarting);
  Join(1, "pod-1", 0, "10.9.0.12");
  EXPECT_FALSE(links_.sent.count(1)) << "no job while node 0 is missing";
  Join(0, "pod-0b", 0, "10.9.0.13");
  ASSERT_TRUE(links_.sent.count(0) && links_.sent.count(1));
  EXPECT_TRUE(links_.Last(0).has_job_spec());
  EXPECT_TRUE(links_.Last(1).has_job_spec());
  EXPECT_EQ(links_.Last(1).job_spec().master_addr(), "10.9.0.13");
  EXPECT_EQ(job_->plan().nodes[0].host, "pod-0b");
  RankStarted(0, 0);
  RankStarted(1, 1);
  EXPECT_EQ(phase(), Phase::kRunning);
}

// Once every node joined the job is sent: a node lost then fails the job.
TEST_F(JoinJobTest, ANodeLostAfterTheJobWasSentFailsIt) {
  StartJob();
  starter_.Finish(Starter::Started{});
  Join(0, "pod-0", 0, "10.9.0.11");
  Join(1, "pod-1", 0, "10.9.0.12");
  job_->OnAgentDisconnected(0, Unavailable("connection reset"));
  EXPECT_EQ(phase(), Phase::kStopping);
  EXPECT_EQ(job_->state().outcome().node, 0);
}

TEST_F(JoinJobTest, AnAgentJoiningAnEndedJobIsToldItFailed) {
  options_.start_timeout_s = 0.05;
  StartJob();
  starter_.Finish(Starter::Started{});
  Join(0, "a", 0, "10.9.0.11");
  // Node 1 never joins: the job fails (69), node 0 is aborted.
  ASSERT_TRUE(dslaunch::testing::RunUntil(
      io_, [&] { return phase() != Phase::kStarting; }));
  EXPECT_EQ(links_.Last(0).abort().exit_status(), 69);
  Join(1, "b", 0, "10.9.0.12");
  ASSERT_TRUE(links_.sent.count(1));
  EXPECT_TRUE(links_.Last(1).has_abort());
  EXPECT_EQ(links_.Last(1).abort().exit_status(), 69);
}

// --num_nodes 2:3: MIN agents and no other for --join_settle start the job
// on them, renumbered; the missing claim that joins later grows it.
TEST_F(JoinJobTest, MinAgentsStartAfterTheSettleAndALateOneGrowsTheJob) {
  options_.plan.num_nodes = 3;
  options_.plan.min_nodes = 2;
  options_.join_settle_s = 0.05;
  options_.restart_backoff_s = 0;
  plan_ = JoinPlan({"join-0", "join-1", "join-2"}, {1, 1, 1}, options_.plan);
  StartJob();
  starter_.Finish(Starter::Started{});
  Join(0, "pod-0", 0, "10.9.0.11", 41000);
  Join(2, "pod-2", 0, "10.9.0.13");
  EXPECT_FALSE(links_.sent.count(0)) << "the settle has not passed";
  ASSERT_TRUE(dslaunch::testing::RunUntil(
      io_, [&] { return links_.sent.count(2) > 0; }));
  const wire::JobSpec two = links_.Last(2).job_spec();
  EXPECT_EQ(two.node_rank(), 1);
  EXPECT_EQ(two.num_nodes(), 2);
  EXPECT_EQ(two.world_size(), 2);
  EXPECT_EQ(two.master_addr(), "10.9.0.11");
  EXPECT_EQ(two.master_port(), 41000);
  RankStarted(0, 0);
  RankStarted(2, 1);
  EXPECT_EQ(phase(), Phase::kRunning);
  // The third pod comes: it stands by, and the job grows to it.
  Join(1, "pod-1", 0, "10.9.0.12", 42000);
  EXPECT_TRUE(links_.Last(1).has_abort());
  EXPECT_TRUE(links_.Last(1).abort().restart());
  EXPECT_EQ(job_->state().outcome().cause, Outcome::Cause::kGrow);
  for (int a : {0, 2}) {
    EXPECT_TRUE(links_.Last(a).abort().restart());
    wire::Envelope exited;
    exited.mutable_worker_exited()->set_rank(a == 0 ? 0 : 1);
    exited.mutable_worker_exited()->set_signal(SIGTERM);
    exited.mutable_worker_exited()->set_stopped(true);
    job_->OnAgentMessage(a, std::move(exited));
    wire::Envelope ended;
    ended.mutable_generation_ended()->set_free_port(43000 + a);
    job_->OnAgentMessage(a, std::move(ended));
  }
  ASSERT_TRUE(dslaunch::testing::RunUntil(
      io_, [&] { return links_.Last(1).has_job_spec(); }));
  for (int a = 0; a < 3; ++a) {
    const wire::JobSpec spec = links_.Last(a).job_spec();
    EXPECT_EQ(spec.node_rank(), a);
    EXPECT_EQ(spec.world_size(), 3);
    EXPECT_EQ(spec.restart_count(), 1);
    EXPECT_EQ(spec.master_port(), 43000);
  }
  EXPECT_EQ(links_.Last(1).job_spec().host(), "pod-1");
}

// --num_nodes 2:3: a pod lost for good after the start leaves a job that
// goes on with the two left (after --join_settle), renumbered.
TEST_F(JoinJobTest, ALostPodLeavesAJobOfMinPodsThatGoesOn) {
  options_.plan.num_nodes = 3;
  options_.plan.min_nodes = 2;
  options_.join_settle_s = 0;
  options_.restart_backoff_s = 0;
  options_.max_restarts = 1;
  starter_.can_start_again = true;  // as JoinStarter: the pod may come back
  starter_.sees_processes = false;
  plan_ = JoinPlan({"join-0", "join-1", "join-2"}, {1, 1, 1}, options_.plan);
  EXPECT_EQ(plan_.min_nodes, 2);
  StartJob();
  starter_.Finish(Starter::Started{});
  for (int p = 0; p < 3; ++p)
    Join(p, "pod-" + std::to_string(p), 0, "10.9.0.1" + std::to_string(p));
  for (int r = 0; r < 3; ++r) RankStarted(r, r);
  EXPECT_EQ(phase(), Phase::kRunning);
  job_->OnAgentDisconnected(1, Unavailable("connection reset"));
  for (int a : {0, 2}) {
    wire::Envelope exited;
    exited.mutable_worker_exited()->set_rank(a);
    exited.mutable_worker_exited()->set_signal(SIGTERM);
    exited.mutable_worker_exited()->set_stopped(true);
    job_->OnAgentMessage(a, std::move(exited));
    wire::Envelope ended;
    ended.mutable_generation_ended();
    job_->OnAgentMessage(a, std::move(ended));
  }
  ASSERT_TRUE(dslaunch::testing::RunUntil(io_, [&] {
    return links_.Last(2).has_job_spec() &&
           links_.Last(2).job_spec().restart_count() == 1;
  }));
  EXPECT_EQ(links_.Last(2).job_spec().node_rank(), 1);
  EXPECT_EQ(links_.Last(2).job_spec().world_size(), 2);
  EXPECT_EQ(links_.Last(0).job_spec().world_size(), 2);
}

}  // namespace
}  // namespace dslaunch::launcher
