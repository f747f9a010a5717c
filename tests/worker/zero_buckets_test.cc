#include <gtest/gtest.h>

#include <cstddef>
#include <vector>

#include "worker/zero_state.h"

namespace dslaunch::worker {
namespace {

using Buckets = std::vector<GradBucket>;

TEST(PlanGradBuckets, FillsFromTheLastLayerDown) {
  const std::vector<size_t> sizes = {100, 100, 100, 10};  // blocks 0-2, lnf
  EXPECT_EQ(PlanGradBuckets(sizes, 210), (Buckets{{1, 3}, {0, 0}}));
  EXPECT_EQ(PlanGradBuckets(sizes, 209), (Buckets{{2, 3}, {0, 1}}));
  EXPECT_EQ(PlanGradBuckets(sizes, 110), (Buckets{{2, 3}, {1, 1}, {0, 0}}));
  EXPECT_EQ(PlanGradBuckets(sizes, 310), (Buckets{{0, 3}}));
  EXPECT_EQ(PlanGradBuckets(sizes, 500000000), (Buckets{{0, 3}}));
}

TEST(PlanGradBuckets, ALayerLargerThanTheBucketStandsAlone) {
  const std::vector<size_t> sizes = {100, 500, 100, 10};
  EXPECT_EQ(PlanGradBuckets(sizes, 1),
            (Buckets{{3, 3}, {2, 2}, {1, 1}, {0, 0}}));
  EXPECT_EQ(PlanGradBuckets(sizes, 200), (Buckets{{2, 3}, {1, 1}, {0, 0}}));
}

TEST(PlanGradBuckets, EveryLayerIsInExactlyOneBucket) {
  std::vector<size_t> sizes;
  for (int i = 0; i < 13; ++i) sizes.push_back(7 + (i * 37) % 50);
  for (long cap : {1L, 30L, 57L, 100L, 1000L}) {
    const Buckets b = PlanGradBuckets(sizes, cap);
    int next = static_cast<int>(sizes.size()) - 1;
    for (const GradBucket& g : b) {
      EXPECT_EQ(g.hi, next) << cap;
      EXPECT_LE(g.lo, g.hi);
      size_t total = 0;
      for (int l = g.lo; l <= g.hi; ++l) total += sizes[l];
      if (g.lo != g.hi) {
        EXPECT_LE(total, static_cast<size_t>(cap));
      }
      next = g.lo - 1;
    }
    EXPECT_EQ(next, -1) << cap;
  }
}

}  // namespace
}  // namespace dslaunch::worker
