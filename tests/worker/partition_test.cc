#include "worker/partition.h"

#include <gtest/gtest.h>

namespace dslaunch::worker {
namespace {

TEST(Partition, EveryWorldSizeCoversAllElementsWithEqualAlignedShards) {
  for (size_t n : {0ul, 1ul, 15ul, 16ul, 17ul, 1000ul, 124439808ul}) {
    for (int world : {1, 2, 3, 4, 7}) {
      Partition p = MakePartition(n, world);
      EXPECT_EQ(p.shard % 16, 0u);
      EXPECT_GE(p.padded(), n);
      EXPECT_LT(p.padded() - n, 16u * world + world) << n << " " << world;
      size_t real = 0;
      for (int r = 0; r < world; ++r) {
        EXPECT_EQ(p.end(r) - p.begin(r), p.shard);
        real += p.real(r);
      }
      EXPECT_EQ(real, n);
    }
  }
}

TEST(Partition, LastShardsMayBePartlyOrWhollyPadding) {
  Partition p = MakePartition(40, 3);  // per rank 14 -> 16
  EXPECT_EQ(p.shard, 16u);
  EXPECT_EQ(p.real(0), 16u);
  EXPECT_EQ(p.real(1), 16u);
  EXPECT_EQ(p.real(2), 8u);
  Partition q =
      MakePartition(17, 4);  // shards of 16: ranks 2 and 3 hold only padding
  EXPECT_EQ(q.real(1), 1u);
  EXPECT_EQ(q.real(3), 0u);
}

}  // namespace
}  // namespace dslaunch::worker
