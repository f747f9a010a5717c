// NCCL on this GPU through the engine's loader (ctest label gpu; skips
// where no GPU is visible or NCCL cannot load).
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <numeric>
#include <string>
#include <vector>

#include "tests/cuda/kernels_test_util.h"
#include "worker/cuda/nccl_comm.h"

namespace dslaunch::worker {
namespace {

// NCCL through cuda::NcclComm on this GPU, one rank (its collectives are
// copies, so the numbers come back unchanged): loading, the unique id, the
// non-blocking communicator and the waits on the stream. A communicator of
// 2 whose second rank never comes fails at its deadline, aborted, instead
// of hanging. Skipped where NCCL cannot load (the engine then takes Gloo).
TEST(NcclComm, OneRankWorksAndAMissingPeerFailsAtTheDeadline) {
  std::string why;
  if (!HaveGpu(&why)) GTEST_SKIP() << "no GPU: " << why;
  cuda::NcclComm probe;
  if (!probe.Load()) GTEST_SKIP() << probe.error();
  ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
  cudaStream_t stream = nullptr;
  CUDA_OK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  std::string id;
  ASSERT_TRUE(probe.UniqueId(&id)) << probe.error();
  ASSERT_EQ(id.size(), 128u);
  {
    cuda::NcclComm one;
    ASSERT_TRUE(one.Join(id, 0, 1, 60)) << one.error();
    ASSERT_TRUE(one.Ready()) << one.error();
    std::vector<float> x(1000);
    std::iota(x.begin(), x.end(), -500.0f);
    Dev<float> d(x);
    ASSERT_TRUE(one.AllReduceSum(d.get(), x.size(), stream)) << one.error();
    EXPECT_EQ(d.Get(), x);
    ASSERT_TRUE(one.ReduceScatterSum(d.get(), x.size(), 0, stream))
        << one.error();
    ASSERT_TRUE(one.AllGather(d.get(), x.size(), 0, stream)) << one.error();
    EXPECT_EQ(d.Get(), x);
    one.Close();  // finalized and destroyed within the deadline
    EXPECT_FALSE(one.joined());
  }
  std::string id2;
  ASSERT_TRUE(probe.UniqueId(&id2)) << probe.error();
  cuda::NcclComm lonely;
  const auto t0 = std::chrono::steady_clock::now();
  ASSERT_TRUE(lonely.Join(id2, 0, 2, 3)) << lonely.error();  // starts
  EXPECT_FALSE(lonely.Ready());
  const double took =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0)
          .count();
  std::printf("nccl: a missing peer failed the join after %.1f s: %s\n", took,
              lonely.error().c_str());
  EXPECT_NE(lonely.error().find("did not finish"), std::string::npos)
      << lonely.error();
  EXPECT_LT(took, 30.0);
  EXPECT_FALSE(lonely.joined());  // aborted
  cudaStreamDestroy(stream);
}

}  // namespace
}  // namespace dslaunch::worker
