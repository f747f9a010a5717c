// The Job driven through every path of its state machine with a FakeStarter
// and fake agent links: no processes, no sockets.
#include "launcher/supervise/job.h"

#include <gtest/gtest.h>
#include <signal.h>

#include <cstdio>

#include "tests/common/run_until.h"
#include "tests/launcher/supervise/job_fixture.h"

namespace dslaunch::launcher {
namespace {

using job_testing::FakeStarter;
using job_testing::JobTest;

TEST_F(JobTest, AgentLostWhileStartingStopsTheOthersAndExits69) {
  StartJob();
  starter_.Finish(Starter::Started{});
  Authenticate(0);
  EXPECT_TRUE(Got(0, wire::Envelope::kJobSpec));
  job_->OnAgentProcessExited(1, "exited with code 127");
  EXPECT_EQ(phase(), Phase::kStopping);
  EXPECT_EQ(links_.Last(0).msg_case(), wire::Envelope::kAbort);
  EXPECT_FALSE(links_.Last(0).abort().kill_now());
  AgentGone(0);
  EXPECT_EQ(phase(), Phase::kEnded);
  EXPECT_TRUE(links_.shut_down);
  EXPECT_EQ(job_->Finish(), 69);
  EXPECT_NE(Report().find("FAILED: node 1 (127.0.0.2) was lost: its agent "
                          "exited with code 127 before connecting"),
            std::string::npos);
}

TEST_F(JobTest, RankFailingWhileOthersStartStopsEveryNodeWithItsCode) {
  StartJob();
  starter_.Finish(Starter::Started{});
  Authenticate(0);
  Authenticate(1);
  RankStarted(0, 0);
  RankStarted(0, 1);
  RankStarted(1, 2);
  EXPECT_EQ(phase(), Phase::kStarting);
  RankExited(0, 0, 3, 0);
  EXPECT_EQ(phase(), Phase::kStopping);
  EXPECT_EQ(links_.Last(0).msg_case(), wire::Envelope::kAbort);
  EXPECT_EQ(links_.Last(1).msg_case(), wire::Envelope::kAbort);
  RankStarted(1, 3);  // a late start is still recorded
  for (int r = 1; r < 4; ++r) RankExited(r / 2, r, 0, SIGTERM, 0, true);
  AgentGone(0);
  EXPECT_EQ(phase(), Phase::kStopping);
  AgentGone(1);
  EXPECT_EQ(phase(), Phase::kEnded);
  EXPECT_EQ(job_->Finish(), 3);
  const std::string report = Report();
  EXPECT_NE(report.find("FAILED: rank 0 on 127.0.0.1"), std::string::npos);
  EXPECT_NE(report.find("stopped in consequence: 3 ranks"), std::string::npos);
}

TEST_F(JobTest, CtrlCDuringStartKillsAgentsThatHaveNotConnected) {
  StartJob();  // the starter has not answered yet (a preflight runs)
  job_->OnSignal(SIGINT);
  EXPECT_EQ(phase(), Phase::kStopping);
  EXPECT_EQ(starter_.killed, (std::vector<int>{0, 1}));
  starter_.Finish(Starter::Started{});  // too late: ignored
  job_->OnAgentProcessExited(0, "was never started");
  job_->OnAgentProcessExited(1, "was never started");
  EXPECT_EQ(phase(), Phase::kEnded);
  EXPECT_EQ(job_->Finish(), 130);
  EXPECT_NE(Report().find("interrupted by the user (SIGINT)"),
            std::string::npos);
}

TEST_F(JobTest, SecondCtrlCKillsAtOnce) {
  StartJob();
  starter_.Finish(Starter::Started{});
  RunAll();
  EXPECT_EQ(phase(), Phase::kRunning);
  job_->OnSignal(SIGINT);
  EXPECT_FALSE(links_.Last(1).abort().kill_now());
  job_->OnSignal(SIGINT);
  EXPECT_TRUE(links_.Last(0).abort().kill_now());
  EXPECT_TRUE(links_.Last(1).abort().kill_now());
  for (int r = 0; r < 4; ++r) RankExited(r / 2, r, 0, SIGKILL, 0, true);
  AgentGone(0);
  AgentGone(1);
  EXPECT_EQ(job_->Finish(), 130);
}

TEST_F(JobTest, LostConnectionToARunningAgentIsNodeLost69) {
  StartJob();
  starter_.Finish(Starter::Started{});
  RunAll();
  job_->OnAgentDisconnected(1, Unavailable("no heartbeat for 10 s"));
  EXPECT_EQ(phase(), Phase::kStopping);
  EXPECT_EQ(links_.Last(0).msg_case(), wire::Envelope::kAbort);
  RankExited(0, 0, 0, SIGTERM, 0, true);
  RankExited(0, 1, 0, SIGTERM, 0, true);
  AgentGone(0);
  job_->OnAgentProcessExited(1, "exited with code 69");
  EXPECT_EQ(job_->Finish(), 69);
  EXPECT_NE(Report().find("its agent's connection ended (no heartbeat for 10 "
                          "s)"),
            std::string::npos);
}

TEST_F(JobTest, EarliestFailureByTheAgentsClockIsTheCause) {
  StartJob();
  starter_.Finish(Starter::Started{});
  RunAll();
  RankExited(1, 2, 0, SIGPIPE, 100.5);  // heard first, happened later
  RankExited(0, 0, 4, 0, 100.0);
  for (int r : {1, 3}) RankExited(r / 2, r, 0, SIGTERM, 101, true);
  AgentGone(0);
  AgentGone(1);
  EXPECT_EQ(job_->state().outcome().rank, 0);
  EXPECT_EQ(job_->Finish(), 4);
}

TEST_F(JobTest, ARankOurStopKilledNeverReplacesTheCause) {
  StartJob();
  starter_.Finish(Starter::Started{});
  RunAll();
  RankExited(0, 0, 1, 0, 100.0);
  // Node 1's clock is behind: its SIGTERMed rank looks earlier.
  RankExited(1, 2, 0, SIGTERM, 99.0, /*stopped=*/true);
  EXPECT_EQ(job_->state().outcome().rank, 0);
  for (int r : {1, 3}) RankExited(r / 2, r, 0, SIGKILL, 98.0, true);
  AgentGone(0);
  AgentGone(1);
  EXPECT_EQ(job_->Finish(), 1);
}

// integration.test_worker's killed rank, seen once under load: rank 1 was
// SIGKILLed (the cause), rank 0 then failed on the broken connection and its
// agent reported first; rank 1's agent reaped it late, when the abort had
// come. The agent says whether it had signalled the rank, so a SIGKILL from
// outside stays the cause.
TEST_F(JobTest, ARankKilledFromOutsideBeforeTheStopIsTheCause) {
  StartJob();
  starter_.Finish(Starter::Started{});
  RunAll();
  RankExited(0, 0, 69, 0, 100.2);  // heard first, happened later
  EXPECT_EQ(job_->state().outcome().rank, 0);
  RankExited(0, 1, 0, SIGTERM, 100.3, /*stopped=*/true);
  RankExited(1, 2, 0, SIGKILL, 100.0, /*stopped=*/false);
  EXPECT_EQ(job_->state().outcome().rank, 2);
  RankExited(1, 3, 0, SIGTERM, 100.4, true);
  AgentGone(0);
  AgentGone(1);
  EXPECT_EQ(job_->Finish(), 137);
  EXPECT_NE(Report().find("rank 2 on "), std::string::npos) << Report();
}

TEST_F(JobTest, AnAgentSignalledFromOutsideStopsTheJobAsAnInterrupt) {
  options_.launcher = "slurm";
  StartJob();
  starter_.Finish(Starter::Started{});
  RunAll();
  wire::Envelope env;
  env.mutable_agent_signalled()->set_signal(SIGTERM);
  job_->OnAgentMessage(1, std::move(env));
  EXPECT_EQ(phase(), Phase::kStopping);
  EXPECT_TRUE(Got(0, wire::Envelope::kAbort));
  // Its ranks die of that SIGTERM first: no rank failure.
  RankExited(1, 2, 0, SIGTERM, 10.0, true);
  RankExited(1, 3, 0, SIGTERM, 10.0, true);
  // srun then says why: the report names it.
  static_cast<Starter::Delegate*>(job_.get())
      ->OnStoppedByScheduler("SLURM cancelled step 9.0 (scancel)");
  RankExited(0, 0, 0, SIGTERM, 11.0, true);
  RankExited(0, 1, 0, SIGTERM, 11.0, true);
  AgentGone(0);
  AgentGone(1);
  EXPECT_EQ(job_->Finish(), 143);  // SIGTERM: a preemption
  const std::string report = Report();
  EXPECT_NE(report.find("SLURM stopped the step (SIGTERM to the agent on "),
            std::string::npos)
      << report;
  EXPECT_NE(report.find("stopped: SLURM cancelled step 9.0 (scancel)"),
            std::string::npos)
      << report;
  EXPECT_EQ(report.find("FAILED"), std::string::npos) << report;
}

TEST_F(JobTest, StartFailureAfterAnInterruptEndsTheJobAndSaysWhy) {
  StartJob();
  job_->OnSignal(SIGINT);
  starter_.Finish(
      InvalidArgument("--launcher local: host x is not this machine"));
  EXPECT_EQ(phase(), Phase::kEnded);
  EXPECT_EQ(job_->Finish(), 130);
  EXPECT_NE(Report().find("host x is not this machine"), std::string::npos);
}

TEST_F(JobTest, OutputOfARankOfAnotherNodeIsDropped) {
  StartJob();
  starter_.Finish(Starter::Started{});
  RunAll();
  wire::Envelope env;
  auto* e = env.mutable_log_batch()->add_entries();
  e->set_rank(3);  // node 1's
  e->set_line("forged");
  job_->OnAgentMessage(0, std::move(env));
  EXPECT_TRUE(console_->LastLines(3).empty());
}

TEST_F(JobTest, AFailedRanksLastLinesAreEscapedInTheReport) {
  StartJob();
  starter_.Finish(Starter::Started{});
  RunAll();
  wire::Envelope env;
  auto* e = env.mutable_log_batch()->add_entries();
  e->set_rank(0);
  e->set_line("boom \x1b]0;owned\x07 \x1b[2J");
  job_->OnAgentMessage(0, std::move(env));
  RankExited(0, 0, 3, 0);
  for (int r = 1; r < 4; ++r) RankExited(r / 2, r, 0, SIGTERM, 0, true);
  AgentGone(0);
  AgentGone(1);
  EXPECT_EQ(job_->Finish(), 3);
  const std::string report = Report();
  EXPECT_NE(report.find("  | boom \\u001b]0;owned\\u0007 \\u001b[2J"),
            std::string::npos)
      << report;
  EXPECT_EQ(report.find('\x1b'), std::string::npos) << report;
}

TEST_F(JobTest, EveryRankFinishingShutsTheAgentsDownAndExits0) {
  StartJob();
  starter_.Finish(Starter::Started{});
  RunAll();
  for (int r = 0; r < 4; ++r) RankExited(r / 2, r, 0, 0);
  EXPECT_EQ(links_.Last(0).msg_case(), wire::Envelope::kShutdown);
  EXPECT_EQ(links_.Last(1).msg_case(), wire::Envelope::kShutdown);
  AgentGone(0);
  AgentGone(1);
  EXPECT_EQ(job_->Finish(), 0);
  EXPECT_NE(Report().find("all 4 ranks on 2 nodes exited 0"),
            std::string::npos);
}

TEST_F(JobTest, WhereTheStarterCannotSeeAgentsAnAgentDoneAndClosedHasEnded) {
  starter_.sees_processes = false;  // mpirun's daemons own the agents
  StartJob();
  starter_.Finish(Starter::Started{});
  RunAll();
  for (int r = 0; r < 4; ++r) RankExited(r / 2, r, 0, 0);
  EXPECT_TRUE(starter_.stopping);
  wire::Envelope done;
  done.mutable_agent_done();
  job_->OnAgentMessage(0, wire::Envelope(done));
  job_->OnAgentDisconnected(0, Status::Ok());
  EXPECT_NE(phase(), Phase::kEnded);
  // Closing without saying it is done is not an end.
  job_->OnAgentDisconnected(1, Status::Ok());
  EXPECT_NE(phase(), Phase::kEnded);
  job_->OnAgentProcessExited(1, "ended with mpirun");
  EXPECT_EQ(phase(), Phase::kEnded);
  EXPECT_EQ(job_->Finish(), 0);
}

TEST_F(JobTest, AStarterThatSeesAgentsWaitsForTheProcessToEnd) {
  StartJob();
  starter_.Finish(Starter::Started{});
  RunAll();
  for (int r = 0; r < 4; ++r) RankExited(r / 2, r, 0, 0);
  wire::Envelope done;
  done.mutable_agent_done();
  for (int n = 0; n < 2; ++n) {
    job_->OnAgentMessage(n, wire::Envelope(done));
    job_->OnAgentDisconnected(n, Status::Ok());
  }
  EXPECT_NE(phase(), Phase::kEnded);
  job_->OnAgentProcessExited(0, "exited with code 0");
  job_->OnAgentProcessExited(1, "exited with code 0");
  EXPECT_EQ(phase(), Phase::kEnded);
}

TEST_F(JobTest, StartFailureEndsTheJobWithItsStatus) {
  StartJob();
  starter_.Finish(Unavailable("the preflight failed; nothing was started"));
  EXPECT_EQ(phase(), Phase::kEnded);
  EXPECT_TRUE(io_.stopped());
  EXPECT_EQ(job_->Finish(), 69);
  EXPECT_NE(Report().find("the preflight failed"), std::string::npos);
}

TEST_F(JobTest, AgentConnectingAfterTheStopIsToldToShutDown) {
  StartJob();
  starter_.Finish(Starter::Started{});
  Authenticate(0);
  job_->OnSignal(SIGTERM);
  Authenticate(1);
  EXPECT_FALSE(Got(1, wire::Envelope::kJobSpec));
  EXPECT_EQ(links_.Last(1).msg_case(), wire::Envelope::kShutdown);
}

TEST_F(JobTest, MasterPortIsTheFreePortNode0Reported) {
  options_.master_port_given = false;
  StartJob();
  starter_.Finish(Starter::Started{});
  Authenticate(1);
  EXPECT_FALSE(Got(1, wire::Envelope::kJobSpec));  // waits for node 0
  Authenticate(0, 41234);
  ASSERT_TRUE(Got(0, wire::Envelope::kJobSpec));
  ASSERT_TRUE(Got(1, wire::Envelope::kJobSpec));
  EXPECT_EQ(links_.Last(0).job_spec().master_port(), 41234);
  EXPECT_EQ(links_.Last(1).job_spec().master_port(), 41234);
  EXPECT_NE(Report().find("MASTER_PORT 41234: a free port on node 0"),
            std::string::npos);
}

TEST_F(JobTest, GivenMasterPortIsKept) {
  options_.plan.master_port = 29611;
  plan_.master_port = 29611;
  StartJob();
  starter_.Finish(Starter::Started{});
  Authenticate(1);
  ASSERT_TRUE(Got(1, wire::Envelope::kJobSpec));
  EXPECT_EQ(links_.Last(1).job_spec().master_port(), 29611);
}

// srun, mpirun, pdsh: a node's secret comes through the tool's pipe, which
// a rank on this host could open; no rank runs before every secret arrived.
// Until every node's agent is in, a secret may still be in the start tool's
// pipe or buffers, where a rank could read it: no node gets its job before.
TEST_F(JobTest, WhereAgentsMakeSecretsNoNodeGetsItsJobBeforeEveryNodeIsIn) {
  starter_.makes_secrets = true;
  options_.plan.master_port = 29611;
  plan_.master_port = 29611;
  StartJob();
  starter_.Finish(Starter::Started{});
  job_->OnAgentSecret(0, "s0");
  job_->OnAgentSecret(1, "s1");
  // Each line lets its node's waiting Hello go on at once.
  EXPECT_EQ(links_.secrets_known, (std::vector<int>{0, 1}));
  Authenticate(0);
  EXPECT_FALSE(Got(0, wire::Envelope::kJobSpec));
  Authenticate(1);
  EXPECT_TRUE(Got(0, wire::Envelope::kJobSpec));
  EXPECT_TRUE(Got(1, wire::Envelope::kJobSpec));
}

TEST_F(JobTest, ASecretAnAgentMadeIsGoodForOneConnection) {
  starter_.makes_secrets = true;
  StartJob();
  EXPECT_EQ(job_->NodeSecret(0), std::nullopt);  // still on its way
  job_->OnAgentSecret(0, "s0");
  EXPECT_EQ(job_->NodeSecret(0), "s0");
  EXPECT_EQ(job_->NodeSecret(1), std::nullopt);
  Authenticate(0);
  EXPECT_EQ(job_->NodeSecret(0), "");  // spent: proves nothing any more
  // Before its agent is in, a second secret for a node fails it, as a
  // second agent would.
  job_->OnAgentSecret(1, "s1");
  job_->OnAgentSecret(1, "again");
  EXPECT_EQ(job_->NodeSecret(1), "");
  EXPECT_NE(phase(), Phase::kStarting);
}

// A secret line after the node's agent authenticated was written by
// something else (a rank through /proc): ignored, not a lost node.
TEST_F(JobTest, ASecretLineAfterTheAgentAuthenticatedIsIgnored) {
  starter_.makes_secrets = true;
  StartJob();
  job_->OnAgentSecret(0, "s0");
  job_->OnAgentSecret(1, "s1");
  Authenticate(0);
  Authenticate(1);
  job_->OnAgentSecret(0, "forged");
  EXPECT_EQ(phase(), Phase::kStarting);
  EXPECT_EQ(job_->NodeSecret(0), "");  // still spent
  EXPECT_TRUE(Got(0, wire::Envelope::kJobSpec));
}

TEST_F(JobTest, AgentsProvingTheJobSecretGetItAndStartAsTheyComeIn) {
  options_.plan.master_port = 29611;
  plan_.master_port = 29611;
  StartJob();
  EXPECT_EQ(job_->NodeSecret(1), "secret");
  Authenticate(1);
  EXPECT_TRUE(Got(1, wire::Envelope::kJobSpec));
  EXPECT_EQ(job_->NodeSecret(1), "secret");
}

TEST_F(JobTest, StartedAgentsGetTheBootstrapOfThePlan) {
  StartJob();
  EXPECT_EQ(starter_.boot_.control_port, 4242);
  EXPECT_EQ(starter_.boot_.secret, "secret");
  EXPECT_EQ(starter_.boot_.plan->nodes.size(), 2u);
  const auto argv = AgentArgv(starter_.boot_, 1, "::1");
  ASSERT_GE(argv.size(), 5u);
  EXPECT_EQ(argv[1], "--connect");
  EXPECT_EQ(argv[2], "[::1]:4242");
  EXPECT_EQ(argv[4], "1");
}

TEST_F(JobTest, UnknownOrRepeatedRankEventsChangeNothing) {
  StartJob();
  starter_.Finish(Starter::Started{});
  RunAll();
  RankStarted(0, 3);       // rank 3 is node 1's
  RankExited(1, 9, 1, 0);  // no rank 9
  RankExited(0, 2, 1, 0);  // wrong node
  EXPECT_EQ(phase(), Phase::kRunning);
  RankExited(0, 0, 0, 0);
  RankExited(0, 0, 5, 0);  // a second exit of rank 0
  EXPECT_EQ(phase(), Phase::kRunning);
}

}  // namespace
}  // namespace dslaunch::launcher
