#include "base/unix_time.h"

#include <gtest/gtest.h>

#include <limits>

namespace dslaunch::base {
namespace {

using std::chrono::milliseconds;

TEST(Millis, TurnsSecondsIntoWholeMilliseconds) {
  EXPECT_EQ(Millis(0), milliseconds(0));
  EXPECT_EQ(Millis(1.5), milliseconds(1500));
  EXPECT_EQ(Millis(0.0004), milliseconds(0));  // cut, not rounded
  EXPECT_EQ(Millis(86400), milliseconds(86'400'000));
}

TEST(Millis, KeepsHostileValuesInRange) {
  EXPECT_EQ(Millis(-3), milliseconds(0));
  EXPECT_EQ(Millis(std::numeric_limits<double>::quiet_NaN()), milliseconds(0));
  EXPECT_EQ(Millis(1e300), milliseconds(1'000'000'000'000));
  EXPECT_EQ(Millis(std::numeric_limits<double>::infinity()),
            milliseconds(1'000'000'000'000));
}

}  // namespace
}  // namespace dslaunch::base
