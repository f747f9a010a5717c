// Row helpers shared by the CPU kernels (kernels_cpu.cc, attention_cpu.cc):
// a vectorisable exp, row max, exp-and-sum, scale; and OpenBLAS's thread
// setting. Internal to the worker library.
#ifndef DSLAUNCH_WORKER_VECTOR_MATH_H_
#define DSLAUNCH_WORKER_VECTOR_MATH_H_

#include <bit>      // std::bit_cast
#include <cstddef>  // size_t
#include <cstdint>  // int32_t, uint32_t

namespace dslaunch::worker {

// Row and range loops in the kernels are written so that GCC vectorises them
// without -ffast-math: sums are `omp simd` reductions (vector partial sums
// combined in an order fixed by the compiled code, the same on every call),
// maxima run in explicit partial lanes, and exp has no branches. Each is
// compiled twice, for AVX2+FMA and for the build's baseline, and picked at load
// time (ifunc), so the last bits depend on the CPU, never on the thread count.
#define DSL_SIMD_CLONES \
  __attribute__((target_clones("arch=x86-64-v3", "default")))

// exp(x) within 2 ulp for x in [-87, 88]; x is clamped to that range first
// (exp(-87) = 1.6e-38 stands in for 0, exp(88) = 1.65e38 for overflow). The
// clamp works on the bit pattern with integer compares: a float compare
// would let GCC split the loop into paths and give up vectorising.
// Cephes' expf: exp(x) = 2^n exp(r), |r| <= ln2/2, degree-6 polynomial.
inline float Exp(float x) {
  uint32_t bits = std::bit_cast<uint32_t>(x);
  bits = bits > 0xC2AE0000u ? 0xC2AE0000u : bits;  // below -87.0f
  int32_t sbits = static_cast<int32_t>(bits);
  sbits = sbits > 0x42B00000 ? 0x42B00000 : sbits;  // above 88.0f
  x = std::bit_cast<float>(sbits);
  constexpr float kRound = 12582912.0f;  // 1.5 * 2^23: t's low bits hold n
  const float t = x * 1.44269504088896341f + kRound;
  const float n = t - kRound;
  float r = x - n * 0.693359375f;
  r = r - n * -2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * (r * r) + r + 1.0f;
  const uint32_t e = std::bit_cast<uint32_t>(t) - 0x4B400000u + 127u;
  return p * std::bit_cast<float>(e << 23);
}

// Maximum of x[0..n), n >= 1.
float RowMax(const float* x, int n);

// y[i] = exp(x[i] - shift) for i < n (y may be x); returns the sum.
double ExpShiftSum(float* y, const float* x, int n, float shift);

// x[i] *= s for i < n.
void ScaleRow(float* x, int n, float s);

// ceil(a / b) for a >= 0, b > 0.
inline int CeilDiv(int a, int b) { return (a + b - 1) / b; }

// Offset of a row in a row-major buffer, in size_t.
inline size_t Idx(size_t row, size_t width) { return row * width; }

// OpenBLAS on one thread (the kernels run their own OpenMP team), once.
void EnsureBlasSingleThreaded();

}  // namespace dslaunch::worker

#endif  // DSLAUNCH_WORKER_VECTOR_MATH_H_
