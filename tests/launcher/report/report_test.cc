#include "launcher/report/report.h"

#include <gtest/gtest.h>
#include <signal.h>

#include "launcher/start/starter.h"

namespace dslaunch::launcher {
namespace {

TEST(Report, SignalsHaveNames) {
  EXPECT_EQ(SignalName(SIGTERM), "SIGTERM");
  EXPECT_EQ(SignalName(SIGKILL), "SIGKILL");
  EXPECT_EQ(SignalName(SIGSEGV), "SIGSEGV");
  EXPECT_EQ(SignalName(200), "signal 200");
}

TEST(Report, ExitStatusIsCodeOr128PlusSignal) {
  EXPECT_EQ(ExitStatusFor(7, 0), 7);
  EXPECT_EQ(ExitStatusFor(0, SIGKILL), 137);
  EXPECT_EQ(ExitStatusFor(0, SIGSEGV), 139);
}

TEST(Report, DescribesExits) {
  EXPECT_EQ(DescribeExit(3, 0), "exited with code 3");
  EXPECT_EQ(DescribeExit(0, SIGABRT), "was killed by SIGABRT");
  EXPECT_EQ(DescribeWaitStatus(5 << 8), "exited with code 5");
  EXPECT_EQ(DescribeWaitStatus(SIGTERM), "was killed by SIGTERM");
}

TEST(Report, LoopbackAliasesAreLocal) {
  EXPECT_TRUE(IsLocalHost("127.0.0.1"));
  EXPECT_TRUE(IsLocalHost("127.0.0.3"));
  EXPECT_TRUE(IsLocalHost("localhost"));
  EXPECT_FALSE(IsLocalHost("192.0.2.1"));  // TEST-NET-1, never local
}

}  // namespace
}  // namespace dslaunch::launcher
