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
  EXPECT_EQ(legal, 5);
  EXPECT_TRUE(IsLegalTransition(Phase::kStarting, Phase::kEnded));
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

}  // namespace
}  // namespace dslaunch::launcher
