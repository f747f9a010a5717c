#include "worker/flat_math.h"

#include <gtest/gtest.h>
#include <omp.h>  // omp_get_max_threads, omp_set_num_threads

#include <cmath>
#include <cstring>  // std::memcmp
#include <limits>
#include <random>
#include <vector>

namespace dslaunch::worker {
namespace {

// Gradient-like values, spread over several decades.
std::vector<float> Values(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> x(n);
  for (size_t i = 0; i < n; ++i)
    x[i] = normal(rng) * std::pow(10.0f, static_cast<float>(i % 7) - 5.0f);
  return x;
}

bool SameBits(double a, double b) { return std::memcmp(&a, &b, 8) == 0; }

TEST(SquaredSum, IsTheSameAtAnyThreadCount) {
  const int saved = omp_get_max_threads();
  const std::vector<float> x = Values(300007, 1);  // many chunks
  std::vector<double> sums;
  for (int threads : {1, 2, 3}) {
    omp_set_num_threads(threads);
    sums.push_back(SquaredSum(x));
  }
  omp_set_num_threads(saved);
  EXPECT_TRUE(SameBits(sums[1], sums[0]));
  EXPECT_TRUE(SameBits(sums[2], sums[0]));
}

// A buffer's padding (an owned piece's, a shard's) leaves the norm as the
// real elements alone give it.
TEST(SquaredSum, AppendedZerosChangeNoBit) {
  for (size_t n : {size_t{5}, size_t{16387}, size_t{50003}}) {
    std::vector<float> x = Values(n, 2);
    const double real = SquaredSum(x);
    for (size_t pad : {size_t{13}, size_t{16384 * 2 + 5}}) {
      x.resize(n + pad, 0.0f);
      EXPECT_TRUE(SameBits(SquaredSum(x), real)) << n << " + " << pad;
    }
  }
}

TEST(SquaredSum, MatchesALongDoubleSum) {
  const std::vector<float> x = Values(200003, 3);
  long double want = 0;
  for (float v : x) want += static_cast<long double>(v) * v;
  EXPECT_NEAR(SquaredSum(x) / static_cast<double>(want), 1.0, 1e-14);
  EXPECT_EQ(SquaredSum({}), 0.0);
}

TEST(ScaleAndSquaredSum, EqualsScalingThenSummingBitForBit) {
  const std::vector<float> x = Values(70001, 4);
  std::vector<float> scaled = x;
  for (float& v : scaled) v *= 0.37f;
  std::vector<float> got = x;
  const double sum = ScaleAndSquaredSum(got, 0.37f);
  EXPECT_TRUE(SameBits(sum, SquaredSum(scaled)));
  EXPECT_EQ(std::memcmp(got.data(), scaled.data(), got.size() * 4), 0);
  got = x;
  EXPECT_TRUE(SameBits(ScaleAndSquaredSum(got, 1.0f), SquaredSum(x)));
  EXPECT_EQ(got, x);
}

// Fresh, the destination's old contents (NaN here) do not matter, and -0
// becomes +0 as it does when added to a zeroed buffer.
TEST(Accumulate, FreshGivesWhatAZeroedDestinationGets) {
  const int saved = omp_get_max_threads();
  omp_set_num_threads(2);
  std::vector<float> src = Values(100003, 5);
  src[17] = -0.0f;
  std::vector<float> zeroed(src.size(), 0.0f);
  Accumulate(zeroed, src, false);
  std::vector<float> fresh(src.size(), std::numeric_limits<float>::quiet_NaN());
  Accumulate(fresh, src, true);
  EXPECT_EQ(std::memcmp(fresh.data(), zeroed.data(), src.size() * 4), 0);
  EXPECT_FALSE(std::signbit(fresh[17]));
  Accumulate(fresh, src, false);
  for (size_t i = 0; i < src.size(); ++i) ASSERT_EQ(fresh[i], src[i] + src[i]);
  omp_set_num_threads(saved);
}

TEST(Copy, CopiesEveryElement) {
  const std::vector<float> src = Values(100003, 6);
  std::vector<float> dst(src.size() + 1, -1.0f);
  Copy(src, dst.data());
  EXPECT_EQ(std::vector<float>(dst.begin(), dst.end() - 1), src);
  EXPECT_EQ(dst.back(), -1.0f);
}

}  // namespace
}  // namespace dslaunch::worker
