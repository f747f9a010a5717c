// The process facts read from /proc that kills by pid rely on.
#include "base/process_tree.h"

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <thread>

namespace dslaunch::base {
namespace {

TEST(ProcessStartTicks, NamesWhenAProcessStartedAndNothingForOneGone) {
  const uint64_t self = ProcessStartTicks(::getpid());
  EXPECT_GT(self, 0u);
  EXPECT_EQ(ProcessStartTicks(::getpid()), self);              // stable
  std::this_thread::sleep_for(std::chrono::milliseconds(30));  // > 1 tick
  const pid_t child = ::fork();
  if (child == 0) {
    ::pause();
    ::_exit(0);
  }
  ASSERT_GT(child, 0);
  const uint64_t started = ProcessStartTicks(child);
  EXPECT_GT(started, self);  // a later process started later
  EXPECT_EQ(ParentOf(child), ::getpid());
  ::kill(child, SIGKILL);
  int status = 0;
  ::waitpid(child, &status, 0);
  EXPECT_EQ(ProcessStartTicks(child), 0u);  // gone and reaped
}

// A name with spaces and a ')' does not shift the fields.
TEST(ProcessStartTicks, ReadsPastANameWithParenthesesAndSpaces) {
  const pid_t child = ::fork();
  if (child == 0) {
    ::execl("/bin/sh", "a) b c", "-c", "exec -a 'x) y' sleep 5",
            static_cast<char*>(nullptr));
    ::_exit(127);
  }
  ASSERT_GT(child, 0);
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  const uint64_t started = ProcessStartTicks(child);
  EXPECT_GT(started, 0u);
  EXPECT_EQ(ParentOf(child), ::getpid());
  ::kill(child, SIGKILL);
  int status = 0;
  ::waitpid(child, &status, 0);
}

}  // namespace
}  // namespace dslaunch::base
