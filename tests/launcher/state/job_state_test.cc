#include "launcher/state/job_state.h"

#include <gtest/gtest.h>
#include <signal.h>

#include "launcher/plan/hostfile.h"

namespace dslaunch::launcher {
namespace {

Plan OneNodeTwoRanks() {
  auto hostfile = ParseHostfile("127.0.0.1 slots=2\n", "hosts");
  EXPECT_TRUE(hostfile.ok());
  auto plan = MakePlan(*hostfile, PlanOptions());
  EXPECT_TRUE(plan.ok());
  return *plan;
}

TEST(JobState, TransitionTableHasOnlyTheDocumentedMoves) {
  const Phase all[] = {Phase::kStarting, Phase::kRunning, Phase::kStopping,
                       Phase::kEnded};
  int legal = 0;
  for (Phase from : all) {
    for (Phase to : all) legal += IsLegalTransition(from, to);
  }
  EXPECT_EQ(legal, 6);
  EXPECT_TRUE(IsLegalTransition(Phase::kStarting, Phase::kEnded));
  EXPECT_TRUE(IsLegalTransition(Phase::kStopping, Phase::kStarting));
  EXPECT_FALSE(IsLegalTransition(Phase::kEnded, Phase::kStarting));
  EXPECT_FALSE(IsLegalTransition(Phase::kRunning, Phase::kEnded));
  EXPECT_FALSE(IsLegalTransition(Phase::kEnded, Phase::kRunning));
  EXPECT_FALSE(IsLegalTransition(Phase::kStopping, Phase::kRunning));
}

TEST(JobState, ExitStatusForEveryCause) {
  Outcome o;
  EXPECT_EQ(ExitStatusFor(o), 70);
  o.cause = Outcome::Cause::kSucceeded;
  EXPECT_EQ(ExitStatusFor(o), 0);
  o.cause = Outcome::Cause::kRankFailed;
  o.exit_code = 3;
  EXPECT_EQ(ExitStatusFor(o), 3);
  o.signal = SIGSEGV;
  EXPECT_EQ(ExitStatusFor(o), 128 + SIGSEGV);
  o.cause = Outcome::Cause::kNodeLost;
  EXPECT_EQ(ExitStatusFor(o), 69);
  o.cause = Outcome::Cause::kInterrupted;
  o.signal = SIGINT;
  EXPECT_EQ(ExitStatusFor(o), 130);
  o.signal = SIGTERM;  // a preemption
  EXPECT_EQ(ExitStatusFor(o), 143);
  o.signal = SIGHUP;
  EXPECT_EQ(ExitStatusFor(o), 129);
  o.cause = Outcome::Cause::kStartFailed;
  o.start_status = InvalidArgument("bad");
  EXPECT_EQ(ExitStatusFor(o), 64);
}

TEST(JobState, FirstCauseWinsOverLaterNodeLossAndInterrupts) {
  JobState s(OneNodeTwoRanks());
  ASSERT_TRUE(s.NodeAuthenticated(0).ok());
  ASSERT_TRUE(s.RankStarted(0, 0, 10).ok());
  ASSERT_TRUE(s.RankStarted(0, 1, 11).ok());
  EXPECT_EQ(s.phase(), Phase::kRunning);
  EXPECT_EQ(*s.RankExited(0, 1, 2, 0, 5.0, ""), JobState::Action::kAbortAll);
  EXPECT_EQ(s.NodeLost(0, "gone"), JobState::Action::kNone);
  EXPECT_EQ(s.Interrupted(SIGINT), JobState::Action::kKillAll);
  EXPECT_EQ(s.outcome().cause, Outcome::Cause::kRankFailed);
  EXPECT_EQ(s.ExitStatus(), 2);
}

TEST(JobState, EndsOnlyWhenEveryNodeFinished) {
  JobState s(OneNodeTwoRanks());
  EXPECT_EQ(s.Interrupted(SIGTERM), JobState::Action::kAbortAll);
  EXPECT_FALSE(s.MaybeEnd());
  EXPECT_EQ(s.AgentProcessExited(0, "was never started"),
            JobState::Action::kNone);  // already stopping
  EXPECT_TRUE(s.MaybeEnd());
  EXPECT_EQ(s.phase(), Phase::kEnded);
  EXPECT_EQ(s.ExitStatus(), 143);  // SIGTERM
}

TEST(JobState, AStopFromOutsideIsAnInterruptThatRankDeathsDoNotReplace) {
  JobState s(OneNodeTwoRanks());
  ASSERT_TRUE(s.NodeAuthenticated(0).ok());
  ASSERT_TRUE(s.RankStarted(0, 0, 10).ok());
  ASSERT_TRUE(s.RankStarted(0, 1, 11).ok());
  EXPECT_EQ(s.StoppedFromOutside(SIGTERM, "SLURM stopped the step"),
            JobState::Action::kAbortAll);
  // The ranks die of that stop; a second word from outside only names the
  // cause better and does not escalate to SIGKILL.
  EXPECT_EQ(*s.RankExited(0, 1, 0, SIGTERM, 5.0, ""), JobState::Action::kNone);
  EXPECT_EQ(s.StoppedFromOutside(SIGTERM, "SLURM cancelled step 7.0"),
            JobState::Action::kNone);
  EXPECT_EQ(s.outcome().cause, Outcome::Cause::kInterrupted);
  EXPECT_EQ(s.outcome().stopped_by, "SLURM cancelled step 7.0");
  EXPECT_EQ(s.ExitStatus(), 143);  // as a preemption
}

TEST(JobState, AStopFromOutsideAfterAFailureChangesNothing) {
  JobState s(OneNodeTwoRanks());
  ASSERT_TRUE(s.NodeAuthenticated(0).ok());
  ASSERT_TRUE(s.RankStarted(0, 0, 10).ok());
  ASSERT_TRUE(s.RankStarted(0, 1, 11).ok());
  EXPECT_EQ(*s.RankExited(0, 0, 4, 0, 5.0, ""), JobState::Action::kAbortAll);
  EXPECT_EQ(s.StoppedFromOutside(SIGTERM, "SLURM"), JobState::Action::kNone);
  EXPECT_EQ(s.outcome().cause, Outcome::Cause::kRankFailed);
  EXPECT_TRUE(s.outcome().stopped_by.empty());
  EXPECT_EQ(s.ExitStatus(), 4);
}

TEST(JobState, StartFailureGoesStraightToEnded) {
  JobState s(OneNodeTwoRanks());
  s.StartFailed(Unavailable("no route"));
  EXPECT_EQ(s.phase(), Phase::kEnded);
  EXPECT_EQ(s.ExitStatus(), 69);
  EXPECT_EQ(s.Interrupted(SIGINT), JobState::Action::kNone);
}

// --max_restarts: generations.

// One node, two ranks, both started; rank 1 fails with `code`.
JobState RunningThenRank1Fails(int max_restarts, int code = 3) {
  JobState s(OneNodeTwoRanks(), max_restarts);
  EXPECT_TRUE(s.NodeAuthenticated(0).ok());
  EXPECT_TRUE(s.RankStarted(0, 0, 100).ok());
  EXPECT_TRUE(s.RankStarted(0, 1, 101).ok());
  EXPECT_EQ(*s.RankExited(0, 1, code, 0, 1.0, ""), JobState::Action::kAbortAll);
  return s;
}

void StopGeneration(JobState& s) {
  EXPECT_TRUE(s.RankExited(0, 0, 0, SIGTERM, 1.1, "", true).ok());
  EXPECT_TRUE(s.NodeIdle(0).ok());
}

TEST(JobState,
     AFailedRankWithRestartsLeftStartsTheNextGenerationOnTheSameNodes) {
  JobState s = RunningThenRank1Fails(2);
  EXPECT_TRUE(s.restart_pending());
  EXPECT_FALSE(s.ReadyToRestart());  // rank 0 still runs
  StopGeneration(s);
  ASSERT_TRUE(s.ReadyToRestart());
  s.NextGeneration(OneNodeTwoRanks());
  EXPECT_EQ(s.phase(), Phase::kStarting);
  EXPECT_EQ(s.restarts(), 1);
  EXPECT_EQ(s.outcome().cause, Outcome::Cause::kNone);
  ASSERT_EQ(s.history().size(), 1u);
  EXPECT_EQ(s.history()[0].restart_count, 0);
  EXPECT_EQ(s.history()[0].outcome.cause, Outcome::Cause::kRankFailed);
  EXPECT_EQ(s.history()[0].outcome.rank, 1);
  EXPECT_EQ(s.history()[0].hosts, std::vector<std::string>{"127.0.0.1"});
  EXPECT_LE(s.history()[0].stopped, s.history()[0].ended);
  // Every rank is pending again: the same ranks start and finish anew.
  for (const auto& [rank, r] : s.ranks()) {
    EXPECT_FALSE(r.started) << rank;
    EXPECT_FALSE(r.exited) << rank;
  }
  EXPECT_FALSE(s.node(0).idle);
  EXPECT_TRUE(s.RankStarted(0, 0, 200).ok());
  EXPECT_TRUE(s.RankStarted(0, 1, 201).ok());
  EXPECT_EQ(s.phase(), Phase::kRunning);
  EXPECT_TRUE(s.RankExited(0, 0, 0, 0, 2.0, "").ok());
  EXPECT_EQ(*s.RankExited(0, 1, 0, 0, 2.0, ""), JobState::Action::kShutdownAll);
  EXPECT_EQ(s.ExitStatus(), 0);
}

TEST(JobState, TheRestartBudgetIsNeverExceeded) {
  JobState s = RunningThenRank1Fails(1);
  StopGeneration(s);
  s.NextGeneration(OneNodeTwoRanks());
  EXPECT_TRUE(s.RankStarted(0, 0, 200).ok());
  EXPECT_TRUE(s.RankStarted(0, 1, 201).ok());
  EXPECT_EQ(*s.RankExited(0, 1, 4, 0, 2.0, ""), JobState::Action::kAbortAll);
  EXPECT_FALSE(s.restart_pending());  // 1 of 1 spent
  StopGeneration(s);
  EXPECT_FALSE(s.ReadyToRestart());
  EXPECT_EQ(s.ExitStatus(), 4);  // the last generation's
}

TEST(JobState, RankFailuresHangsAndLostNodesRestart) {
  // A hang does.
  JobState hung(OneNodeTwoRanks(), 3);
  ASSERT_TRUE(hung.NodeAuthenticated(0).ok());
  ASSERT_TRUE(hung.RankStarted(0, 0, 1).ok());
  EXPECT_EQ(hung.Hung(0, "silent"), JobState::Action::kAbortAll);
  EXPECT_TRUE(hung.restart_pending());
  // A rank its agent could not start does not: it would fail every time.
  JobState missing(OneNodeTwoRanks(), 3);
  ASSERT_TRUE(missing.NodeAuthenticated(0).ok());
  EXPECT_EQ(*missing.RankExited(0, 0, 127, 0, 1.0,
                                "cannot execute 'x': No such file"),
            JobState::Action::kAbortAll);
  EXPECT_FALSE(missing.restart_pending());
  // A lost node does (its agent is started again).
  JobState lost(OneNodeTwoRanks(), 3);
  EXPECT_EQ(lost.NodeLost(0, "gone"), JobState::Action::kAbortAll);
  EXPECT_TRUE(lost.restart_pending());
  // Not an interrupt, a stop from outside, or success.
  JobState interrupted(OneNodeTwoRanks(), 3);
  EXPECT_EQ(interrupted.Interrupted(SIGINT), JobState::Action::kAbortAll);
  EXPECT_FALSE(interrupted.restart_pending());
  JobState preempted(OneNodeTwoRanks(), 3);
  EXPECT_EQ(preempted.StoppedFromOutside(SIGTERM, "SLURM stopped the step"),
            JobState::Action::kAbortAll);
  EXPECT_FALSE(preempted.restart_pending());
  JobState done(OneNodeTwoRanks(), 3);
  ASSERT_TRUE(done.NodeAuthenticated(0).ok());
  ASSERT_TRUE(done.RankExited(0, 0, 0, 0, 1, "").ok());
  EXPECT_EQ(*done.RankExited(0, 1, 0, 0, 1, ""),
            JobState::Action::kShutdownAll);
  EXPECT_FALSE(done.restart_pending());
}

TEST(JobState, CtrlCWhileARestartIsDueEndsTheJobWith130) {
  JobState s = RunningThenRank1Fails(3);
  StopGeneration(s);
  ASSERT_TRUE(s.ReadyToRestart());  // waiting out --restart_backoff
  EXPECT_EQ(s.Interrupted(SIGINT), JobState::Action::kAbortAll);
  EXPECT_FALSE(s.restart_pending());
  EXPECT_FALSE(s.ReadyToRestart());
  EXPECT_EQ(s.outcome().cause, Outcome::Cause::kInterrupted);
  EXPECT_EQ(s.ExitStatus(), 130);
  ASSERT_EQ(s.history().size(), 1u);  // the failure, told as its generation
  EXPECT_EQ(s.history()[0].outcome.cause, Outcome::Cause::kRankFailed);
  EXPECT_EQ(s.Interrupted(SIGINT), JobState::Action::kKillAll);  // again
}

TEST(JobState, ASigtermWhileARestartIsDueEndsTheJobWith143) {
  JobState s = RunningThenRank1Fails(3);
  EXPECT_EQ(s.StoppedFromOutside(SIGTERM, "SLURM cancelled step 7.0"),
            JobState::Action::kAbortAll);
  EXPECT_FALSE(s.restart_pending());
  EXPECT_EQ(s.ExitStatus(), 143);
  EXPECT_EQ(s.outcome().stopped_by, "SLURM cancelled step 7.0");
}

TEST(JobState, ANodeLostWhileARestartIsDueIsWaitedFor) {
  JobState s = RunningThenRank1Fails(3);
  StopGeneration(s);
  EXPECT_EQ(s.NodeDisconnected(0, "connection reset"), JobState::Action::kNone);
  EXPECT_TRUE(s.restart_pending());
  // Every rank is gone, but no agent is ready: the Job waits for it.
  EXPECT_TRUE(s.ReadyToRestart());
  EXPECT_TRUE(s.ReadyAgents().empty());
  EXPECT_EQ(s.MissingNodes(),
            std::vector<std::string>{
                "127.0.0.1 (its agent's connection ended (connection reset))"});
  EXPECT_EQ(s.AgentProcessExited(0, "was killed"), JobState::Action::kNone);
  EXPECT_FALSE(s.MaybeEnd());  // a restart is due: the job waits
  // Its agent is started again and comes back.
  s.NodeRestarting(0);
  EXPECT_FALSE(s.node(0).finished());
  ASSERT_TRUE(s.NodeAuthenticated(0).ok());
  EXPECT_TRUE(s.ReadyToRestart());
  EXPECT_EQ(s.ReadyAgents(), std::vector<int>{0});
  EXPECT_TRUE(s.MissingNodes().empty());
  s.NextGeneration(OneNodeTwoRanks());
  EXPECT_EQ(s.restarts(), 1);
}

TEST(JobState, ARestartCalledOffEndsTheJobWithTheFailure) {
  JobState s = RunningThenRank1Fails(3);
  StopGeneration(s);
  EXPECT_EQ(s.NodeDisconnected(0, "connection reset"), JobState::Action::kNone);
  s.CallOffRestart("--launcher pdsh cannot start node 0's agent again");
  EXPECT_FALSE(s.restart_pending());
  EXPECT_EQ(s.ExitStatus(), 3);  // the failure stays the outcome
  EXPECT_EQ(s.outcome().no_restart,
            "--launcher pdsh cannot start node 0's agent again");
  EXPECT_EQ(s.AgentProcessExited(0, "exited"), JobState::Action::kNone);
  EXPECT_TRUE(s.MaybeEnd());
}

TEST(JobState, NodesThatDoNotComeBackEndTheJobWith69) {
  JobState s = RunningThenRank1Fails(3);
  StopGeneration(s);
  EXPECT_EQ(s.NodeLost(0, "its agent was killed"), JobState::Action::kNone);
  s.GiveUpRejoin("127.0.0.1 did not come back within --rejoin_timeout 5 s");
  EXPECT_FALSE(s.restart_pending());
  EXPECT_EQ(s.outcome().cause, Outcome::Cause::kNodeLost);
  EXPECT_EQ(s.ExitStatus(), 69);
  ASSERT_EQ(s.history().size(), 1u);
  EXPECT_EQ(s.history()[0].outcome.cause, Outcome::Cause::kRankFailed);
}

TEST(JobState, AGrowRestartsWithoutSpendingTheBudget) {
  JobState s(OneNodeTwoRanks(), 0);  // no budget at all
  ASSERT_TRUE(s.NodeAuthenticated(0).ok());
  EXPECT_TRUE(s.RankStarted(0, 0, 100).ok());
  EXPECT_TRUE(s.RankStarted(0, 1, 101).ok());
  ASSERT_TRUE(s.Grow("node 1 stands by"));
  EXPECT_TRUE(s.restart_pending());
  EXPECT_FALSE(s.Grow("again"));  // already stopping
  // Our stop ends the ranks (dsworker: 143 after its checkpoint).
  EXPECT_TRUE(s.RankExited(0, 0, 143, 0, 1.0, "", true).ok());
  EXPECT_TRUE(s.RankExited(0, 1, 143, 0, 1.0, "", true).ok());
  EXPECT_TRUE(s.restart_pending());
  EXPECT_TRUE(s.NodeIdle(0).ok());
  s.NextGeneration(OneNodeTwoRanks());
  EXPECT_EQ(s.restarts(), 1);
  EXPECT_EQ(s.failure_restarts(), 0);
  EXPECT_EQ(s.history()[0].outcome.cause, Outcome::Cause::kGrow);
}

TEST(JobState, RanksThatFinishedOnTheirOwnDuringAGrowEndTheJob) {
  JobState s(OneNodeTwoRanks(), 3);
  ASSERT_TRUE(s.NodeAuthenticated(0).ok());
  EXPECT_TRUE(s.RankStarted(0, 0, 100).ok());
  EXPECT_TRUE(s.RankStarted(0, 1, 101).ok());
  ASSERT_TRUE(s.Grow("node 1 stands by"));
  // Both had exited 0 before the stop reached them: done, not run again.
  EXPECT_EQ(*s.RankExited(0, 0, 0, 0, 1.0, "", false), JobState::Action::kNone);
  EXPECT_EQ(*s.RankExited(0, 1, 0, 0, 1.0, "", false),
            JobState::Action::kShutdownAll);
  EXPECT_FALSE(s.restart_pending());
  EXPECT_EQ(s.outcome().cause, Outcome::Cause::kSucceeded);
  EXPECT_EQ(s.ExitStatus(), 0);
}

TEST(JobState, ANodeLostTwiceWithinTheCooldownIsExcluded) {
  JobState s(OneNodeTwoRanks(), 5, /*node_cooldown_s=*/600);
  ASSERT_TRUE(s.NodeAuthenticated(0).ok());
  EXPECT_EQ(s.NodeLost(0, "gone"), JobState::Action::kAbortAll);
  EXPECT_TRUE(s.restart_pending());  // a lost node restarts the job
  EXPECT_EQ(s.node(0).losses, 1);
  EXPECT_EQ(s.node(0).excluded_until, Clock::time_point{});  // once: not
  s.NodeRestarting(0);
  ASSERT_TRUE(s.NodeAuthenticated(0).ok());
  s.NextGeneration(OneNodeTwoRanks());
  ASSERT_TRUE(s.NodeAuthenticated(0).ok());
  EXPECT_EQ(s.NodeLost(0, "gone again"), JobState::Action::kAbortAll);
  EXPECT_EQ(s.node(0).losses, 2);
  EXPECT_GT(s.node(0).excluded_until, Clock::now() + std::chrono::seconds(590));
}

// Where agents run one generation each (mpirun's): the ended generation's
// agents are not ready for the next one; their end is the start mode's way,
// no loss for the cooldown; each new agent runs the next generation.
TEST(JobState, AgentsThatRunOneGenerationAreReplacedWithoutStrikes) {
  JobState s(OneNodeTwoRanks(), 3, /*node_cooldown_s=*/600);
  s.SetAgentsRunOneGeneration();
  EXPECT_TRUE(s.node(0).spent);
  ASSERT_TRUE(s.NodeAuthenticated(0).ok());
  EXPECT_TRUE(s.RankStarted(0, 0, 100).ok());
  EXPECT_TRUE(s.RankStarted(0, 1, 101).ok());
  EXPECT_EQ(*s.RankExited(0, 1, 3, 0, 1.0, ""), JobState::Action::kAbortAll);
  StopGeneration(s);
  ASSERT_TRUE(s.ReadyToRestart());
  EXPECT_TRUE(s.ReadyAgents().empty());  // spent: it waits, runs nothing
  for (int round = 0; round < 2; ++round) {
    // It is told to end and does (its tool reports the end).
    EXPECT_EQ(s.NodeDisconnected(0, "closed"), JobState::Action::kNone);
    EXPECT_EQ(s.AgentProcessExited(0, "ended with mpirun"),
              JobState::Action::kNone);
    EXPECT_EQ(s.node(0).losses, 0);
    EXPECT_EQ(s.node(0).excluded_until, Clock::time_point{});
    EXPECT_FALSE(s.MaybeEnd());  // the restart waits for the new agent
    s.NodeRestarting(0);
    EXPECT_FALSE(s.node(0).spent);
    ASSERT_TRUE(s.NodeAuthenticated(0).ok());
    EXPECT_EQ(s.ReadyAgents(), std::vector<int>{0});
    s.NextGeneration(OneNodeTwoRanks());
    EXPECT_TRUE(s.node(0).spent);  // it runs this generation only
    EXPECT_EQ(s.restarts(), round + 1);
    EXPECT_TRUE(s.RankStarted(0, 0, 200).ok());
    EXPECT_TRUE(s.RankStarted(0, 1, 201).ok());
    if (round == 1) break;
    EXPECT_EQ(*s.RankExited(0, 1, 3, 0, 2.0, ""), JobState::Action::kAbortAll);
    StopGeneration(s);
    ASSERT_TRUE(s.ReadyToRestart());
    EXPECT_TRUE(s.ReadyAgents().empty());
  }
  EXPECT_TRUE(s.RankExited(0, 0, 0, 0, 3.0, "").ok());
  EXPECT_EQ(*s.RankExited(0, 1, 0, 0, 3.0, ""), JobState::Action::kShutdownAll);
  EXPECT_EQ(s.ExitStatus(), 0);
}

TEST(JobState, AGenerationEndBeforeTheRanksExitsOrWhileRunningIsRefused) {
  JobState s(OneNodeTwoRanks(), 3);
  ASSERT_TRUE(s.NodeAuthenticated(0).ok());
  ASSERT_TRUE(s.RankStarted(0, 0, 1).ok());
  EXPECT_FALSE(s.NodeIdle(0).ok());  // running
  ASSERT_TRUE(s.RankExited(0, 0, 9, 0, 1, "").ok());
  EXPECT_FALSE(s.NodeIdle(1).ok());  // no such node
  ASSERT_TRUE(s.RankStarted(0, 1, 2).ok());
  EXPECT_FALSE(s.NodeIdle(0).ok());  // rank 1 has not exited
  EXPECT_FALSE(s.node(0).idle);
}

}  // namespace
}  // namespace dslaunch::launcher
