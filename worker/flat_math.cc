#include "worker/flat_math.h"

#include <algorithm>  // std::min
#include <cstring>    // std::memcpy
#include <vector>

#include "base/status.h"         // DSL_CHECK
#include "worker/parallel.h"     // ParallelRanges
#include "worker/vector_math.h"  // DSL_SIMD_CLONES, ScaleRow

namespace dslaunch::worker {
namespace {

constexpr size_t kSumChunk = size_t{1} << 14;  // fits ScaleRow's int count
constexpr size_t kSumLanes = 16;

// Sum of x[i]^2, i < n <= kSumChunk, in SquaredSum's lanes. The square is exact
// in double, so a fused multiply-add rounds as a multiply then an add does.
DSL_SIMD_CLONES double ChunkSquares(const float* x, size_t n) {
  double acc[kSumLanes] = {};
  size_t i = 0;
  for (; i + kSumLanes <= n; i += kSumLanes) {
    for (size_t j = 0; j < kSumLanes; ++j)
      acc[j] += static_cast<double>(x[i + j]) * x[i + j];
  }
  for (size_t j = 0; i + j < n; ++j)
    acc[j] += static_cast<double>(x[i + j]) * x[i + j];
  double sum = 0;
  for (double a : acc) sum += a;
  return sum;
}

// The sum over [0, n)'s fixed chunks of chunk_sum(begin, end), the chunks
// computed in parallel and added in order.
template <typename Fn>
double ChunkedSum(size_t n, const Fn& chunk_sum) {
  std::vector<double> partial((n + kSumChunk - 1) / kSumChunk);
  ParallelRanges(
      partial.size(),
      [&](size_t b, size_t e) {
        for (size_t c = b; c < e; ++c)
          partial[c] =
              chunk_sum(c * kSumChunk, std::min(n, (c + 1) * kSumChunk));
      },
      /*block=*/1, /*min_parallel=*/kMinParallel / kSumChunk);
  double sum = 0;
  for (double p : partial) sum += p;
  return sum;
}

}  // namespace

double SquaredSum(std::span<const float> x) {
  return ChunkedSum(x.size(), [x](size_t b, size_t e) {
    return ChunkSquares(x.data() + b, e - b);
  });
}

double ScaleAndSquaredSum(std::span<float> x, float scale) {
  if (scale == 1.0f) return SquaredSum(x);
  return ChunkedSum(x.size(), [x, scale](size_t b, size_t e) {
    ScaleRow(x.data() + b, static_cast<int>(e - b), scale);
    return ChunkSquares(x.data() + b, e - b);
  });
}

void Accumulate(std::span<float> dst, std::span<const float> src, bool fresh) {
  DSL_CHECK(dst.size() == src.size());
  float* d = dst.data();
  const float* s = src.data();
  ParallelRanges(src.size(), [=](size_t b, size_t e) {
    if (fresh) {
      for (size_t i = b; i < e; ++i) d[i] = 0.0f + s[i];
    } else {
      for (size_t i = b; i < e; ++i) d[i] += s[i];
    }
  });
}

void Copy(std::span<const float> src, float* dst) {
  ParallelRanges(src.size(), [=](size_t b, size_t e) {
    std::memcpy(dst + b, src.data() + b, (e - b) * sizeof(float));
  });
}

}  // namespace dslaunch::worker
