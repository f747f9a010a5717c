// fp16 loss scaling step by step as DeepSpeed's DynamicLossScaler does it.
#include "worker/loss_scaler.h"

#include <gtest/gtest.h>

namespace dslaunch::worker {
namespace {

Fp16Config Dynamic(int power, int window, int hysteresis, double min) {
  Fp16Config c;
  c.enabled = true;
  c.initial_scale_power = power;
  c.loss_scale_window = window;
  c.hysteresis = hysteresis;
  c.min_loss_scale = min;
  return c;
}

TEST(LossScaler, StartsAtTwoToTheInitialPower) {
  EXPECT_EQ(LossScaler(Fp16Config{}).scale(), 65536.0);  // DeepSpeed's 16
  EXPECT_EQ(LossScaler(Dynamic(3, 10, 2, 1)).scale(), 8.0);
}

// The window counts from the start (iteration 0 counts: the first step
// already doubles, as in DeepSpeed where last_overflow_iter starts at -1).
TEST(LossScaler, DoublesEveryWindowOfCleanSteps) {
  LossScaler s(Dynamic(4, 3, 2, 1));
  std::vector<double> scales;
  for (int i = 0; i < 7; ++i) {
    ASSERT_TRUE(s.Update(false).ok());
    scales.push_back(s.scale());
  }
  // iter 0: (0 - -1) % 3 = 1; iter 2: 3 % 3 = 0 -> double; iter 5 again.
  EXPECT_EQ(scales, (std::vector<double>{16, 16, 32, 32, 32, 64, 64}));
  EXPECT_EQ(s.skipped_steps(), 0);
}

TEST(LossScaler, HysteresisAbsorbsOverflowsBeforeTheScaleHalves) {
  LossScaler s(Dynamic(4, 1000, 2, 1));
  ASSERT_TRUE(s.Update(true).ok());
  EXPECT_EQ(s.scale(), 16.0);  // hysteresis 2 -> 1: kept
  ASSERT_TRUE(s.Update(true).ok());
  EXPECT_EQ(s.scale(), 8.0);  // none left: halved
  ASSERT_TRUE(s.Update(true).ok());
  EXPECT_EQ(s.scale(), 4.0);  // still none (only a doubling restores it)
  EXPECT_EQ(s.skipped_steps(), 3);
}

TEST(LossScaler, TheWindowCountsFromTheLastOverflow) {
  LossScaler s(Dynamic(4, 2, 1, 1));
  ASSERT_TRUE(s.Update(true).ok());  // iter 0: 16 -> 8
  EXPECT_EQ(s.scale(), 8.0);
  ASSERT_TRUE(s.Update(false).ok());  // iter 1: 1 % 2
  EXPECT_EQ(s.scale(), 8.0);
  ASSERT_TRUE(s.Update(false).ok());  // iter 2: 2 % 2 = 0: doubles
  EXPECT_EQ(s.scale(), 16.0);
}

TEST(LossScaler, NeverBelowTheMinimumAndAnErrorAtIt) {
  LossScaler s(Dynamic(2, 1000, 1, 2));
  ASSERT_TRUE(s.Update(true).ok());
  EXPECT_EQ(s.scale(), 2.0);
  const Status st = s.Update(true);
  EXPECT_FALSE(st.ok());
  EXPECT_NE(st.message().find("minimum loss scale"), std::string::npos);
}

TEST(LossScaler, AStaticScaleStaysAndItsOverflowsAreSkipped) {
  Fp16Config c;
  c.enabled = true;
  c.loss_scale = 128;
  LossScaler s(c);
  for (bool overflow : {false, true, false, true})
    ASSERT_TRUE(s.Update(overflow).ok());
  EXPECT_EQ(s.scale(), 128.0);
  EXPECT_EQ(s.skipped_steps(), 2);
}

}  // namespace
}  // namespace dslaunch::worker
