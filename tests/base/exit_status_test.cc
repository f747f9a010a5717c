#include "base/exit_status.h"

#include <gtest/gtest.h>
#include <signal.h>

namespace dslaunch {
namespace {

TEST(ExitWords, SignalsHaveNames) {
  EXPECT_EQ(SignalName(SIGTERM), "SIGTERM");
  EXPECT_EQ(SignalName(SIGKILL), "SIGKILL");
  EXPECT_EQ(SignalName(SIGSEGV), "SIGSEGV");
  EXPECT_EQ(SignalName(200), "signal 200");
}

TEST(ExitWords, ExitStatusIsCodeOr128PlusSignal) {
  EXPECT_EQ(ExitStatusForProcess(7, 0), 7);
  EXPECT_EQ(ExitStatusForProcess(0, SIGKILL), 137);
  EXPECT_EQ(ExitStatusForProcess(0, SIGSEGV), 139);
}

TEST(ExitWords, DescribesExits) {
  EXPECT_EQ(DescribeExit(3, 0), "exited with code 3");
  EXPECT_EQ(DescribeExit(0, SIGABRT), "was killed by SIGABRT");
  EXPECT_EQ(DescribeWaitStatus(5 << 8), "exited with code 5");
  EXPECT_EQ(DescribeWaitStatus(SIGTERM), "was killed by SIGTERM");
  EXPECT_EQ(DescribeWaitStatus(SIGSEGV | 0x80),
            "was killed by SIGSEGV (core dumped)");
}

}  // namespace
}  // namespace dslaunch
