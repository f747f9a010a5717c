// What the CUDA kernel tests share (kernels_test.cc, matmul_test.cc,
// attention_test.cc, nccl_test.cc): random inputs, the relative error, device
// copies of host vectors, and the fixture with its context and shapes.
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#include "worker/cuda/kernels_cuda.h"
#include "worker/device_loader.h"

namespace dslaunch::worker {

inline bool HaveGpu(std::string* why) { return CudaDeviceCount(why) > 0; }

#define CUDA_OK(x) ASSERT_EQ((x), cudaSuccess) << #x

inline std::vector<float> Random(size_t n, std::mt19937& rng, float lo = -1,
                                 float hi = 1) {
  std::uniform_real_distribution<float> d(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) x = d(rng);
  return v;
}

// ||a - b|| / ||b||; NaN anywhere is infinite.
inline double RelErr(const std::vector<float>& a, const std::vector<float>& b) {
  double num = 0, den = 0;
  for (size_t i = 0; i < b.size(); i++) {
    if (std::isnan(a[i])) return INFINITY;
    num += (static_cast<double>(a[i]) - b[i]) * (a[i] - b[i]);
    den += static_cast<double>(b[i]) * b[i];
  }
  return den == 0 ? std::sqrt(num) : std::sqrt(num / den);
}

// A device copy of a host vector, read back with Get().
template <typename X>
class Dev {
 public:
  explicit Dev(const std::vector<X>& host) : n_(host.size()) {
    EXPECT_EQ(cudaMalloc(&p_, n_ * sizeof(X)), cudaSuccess);
    EXPECT_EQ(
        cudaMemcpy(p_, host.data(), n_ * sizeof(X), cudaMemcpyHostToDevice),
        cudaSuccess);
  }
  explicit Dev(size_t n) : Dev(std::vector<X>(n, Poison())) {}
  ~Dev() { cudaFree(p_); }
  X* get() { return p_; }
  std::vector<X> Get() const {
    std::vector<X> h(n_);
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    EXPECT_EQ(cudaMemcpy(h.data(), p_, n_ * sizeof(X), cudaMemcpyDeviceToHost),
              cudaSuccess);
    return h;
  }

 private:
  static X Poison() {
    if constexpr (std::is_same_v<X, float>) return NAN;
    return X{};
  }
  X* p_ = nullptr;
  size_t n_;
};

class KernelsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string why;
    if (!HaveGpu(&why)) GTEST_SKIP() << "no GPU: " << why;
    ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
    ASSERT_EQ(cublasCreate(&ctx_.blas), CUBLAS_STATUS_SUCCESS);
    ctx_.compute = CUBLAS_COMPUTE_32F;
    rng_.seed(::testing::UnitTest::GetInstance()->random_seed() + 17);
  }
  void TearDown() override {
    if (ctx_.blas == nullptr) return;  // skipped
    cuda::LtDestroy(ctx_.lt);
    cublasDestroy(ctx_.blas);
    EXPECT_EQ(cudaGetLastError(), cudaSuccess);
  }
  // The products on 16-bit operands of `type`, rounded into a and b.
  void SixteenBit(cudaDataType_t type, void* a, size_t a_elems, void* b,
                  size_t b_elems) {
    ctx_.operands = type;
    ctx_.operand_a = a;
    ctx_.operand_b = b;
    ctx_.operand_a_elems = a_elems;
    ctx_.operand_b_elems = b_elems;
  }
  cuda::Ctx ctx_;
  std::mt19937 rng_;
  // Shapes: hs = 24 (not a multiple of the warp), T not a multiple of 32.
  const int B = 2, T = 67, C = 96, NH = 4, V = 300, Vp = 320;
};

constexpr double kFp32 = 1e-5;

}  // namespace dslaunch::worker
