#include "worker/stop_signal.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <thread>

namespace dslaunch::worker {
namespace {

using Clock = std::chrono::steady_clock;

// Runs `child` in a forked process (the handler and the watchdog are
// process-wide); returns its wait status and how long it ran, in seconds.
template <typename F>
std::pair<int, double> InChild(F child) {
  const auto start = Clock::now();
  const pid_t pid = ::fork();
  if (pid == 0) {
    child();
    ::_exit(0);
  }
  int status = 0;
  EXPECT_EQ(::waitpid(pid, &status, 0), pid);
  return {status, std::chrono::duration<double>(Clock::now() - start).count()};
}

TEST(StopSignal, IsRecordedOnceAndLaterOnesChangeNothing) {
  auto [status, seconds] = InChild([] {
    CatchStopSignal();
    if (StopSignal() != 0) ::_exit(1);
    ::raise(SIGTERM);
    ::raise(SIGTERM);  // not the default action: still alive
    if (StopSignal() != SIGTERM) ::_exit(2);
    NoteStopAgreed();
    ::_exit(0);
  });
  ASSERT_TRUE(WIFEXITED(status)) << status;
  EXPECT_EQ(WEXITSTATUS(status), 0);
}

TEST(StopSignal, ARankThatEndsNoStepIsEndedByTheWatchdog) {
  auto [status, seconds] = InChild([] {
    CatchStopSignal();
    NoteStepDone();
    ::raise(SIGTERM);
    std::this_thread::sleep_for(std::chrono::seconds(20));  // "blocked"
    ::_exit(3);
  });
  ASSERT_TRUE(WIFEXITED(status)) << status;
  EXPECT_EQ(WEXITSTATUS(status), 128 + SIGTERM);
  EXPECT_GE(seconds, 1.9);  // the 2 s floor
  EXPECT_LT(seconds, 10);
}

TEST(StopSignal, AnAgreedStopTakesTheTimeItsSaveNeeds) {
  auto [status, seconds] = InChild([] {
    CatchStopSignal();
    NoteStepDone();
    ::raise(SIGTERM);
    NoteStopAgreed();
    std::this_thread::sleep_for(std::chrono::milliseconds(2600));  // saving
    ::_exit(0);
  });
  ASSERT_TRUE(WIFEXITED(status)) << status;
  EXPECT_EQ(WEXITSTATUS(status), 0) << "the watchdog cut a save short";
  EXPECT_GE(seconds, 2.5);
}

}  // namespace
}  // namespace dslaunch::worker
