#include "worker/vector_math.h"

#include <cblas.h>  // openblas_set_num_threads (OpenBLAS)

#include <mutex>  // std::call_once

namespace dslaunch::worker {

// Maximum of x[0..n), n >= 1, in 16 partial maxima: GCC 12 compiles an
// `omp simd` max reduction into code 2-3x slower than this.
DSL_SIMD_CLONES float RowMax(const float* x, int n) {
  constexpr int kLanes = 16;
  float acc[kLanes];
  for (int j = 0; j < kLanes; j++) acc[j] = x[0];
  int i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    for (int j = 0; j < kLanes; j++) acc[j] = std::max(acc[j], x[i + j]);
  }
  for (; i < n; i++) acc[0] = std::max(acc[0], x[i]);
  for (int j = 1; j < kLanes; j++) acc[0] = std::max(acc[0], acc[j]);
  return acc[0];
}

// y[i] = exp(x[i] - shift) for i < n (y may be x); returns the sum, kept in
// float for 1024 elements at a time and in a double across those.
DSL_SIMD_CLONES double ExpShiftSum(float* y, const float* x, int n,
                                   float shift) {
  double total = 0.0;
  for (int i0 = 0; i0 < n; i0 += 1024) {
    const int i1 = std::min(n, i0 + 1024);
    float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
    for (int i = i0; i < i1; i++) {
      y[i] = Exp(x[i] - shift);
      sum += y[i];
    }
    total += sum;
  }
  return total;
}

DSL_SIMD_CLONES void ScaleRow(float* x, int n, float s) {
  for (int i = 0; i < n; i++) x[i] *= s;
}

void EnsureBlasSingleThreaded() {
  static std::once_flag once;
  std::call_once(once, [] { openblas_set_num_threads(1); });
}

}  // namespace dslaunch::worker
