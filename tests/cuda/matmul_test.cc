// The linear layers' products (worker/cuda/matmul_cuda.cu) against the
// CPU's (ctest label gpu; every test skips, saying why, where no GPU is
// visible): fp32 within 1e-5 relative, the bias in cuBLASLt's epilogue as
// written first, the 16-bit operands within their rounding (bf16 keeps 8
// significant bits: each operand off by up to 2^-9 relative, a sum over K
// products averaging those errors to a few 1e-3), the operands and
// results kept rounded, and dout rounded once for both backward products.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "tests/cuda/kernels_test_util.h"
#include "worker/cuda/kernels_cuda.h"
#include "worker/kernels_cpu.h"

namespace dslaunch::worker {
namespace {

TEST_F(KernelsTest, Matmul) {
  const int N = B * T, OC = 3 * C;
  auto x = Random(N * C, rng_), w = Random(OC * C, rng_),
       bias = Random(OC, rng_);
  for (bool with_bias : {true, false}) {
    std::vector<float> out(N * OC);
    MatmulForwardReference(out.data(), x.data(), w.data(),
                           with_bias ? bias.data() : nullptr, N, C, OC);
    Dev<float> gx(x), gw(w), gbias(bias), gout(N * OC);
    ASSERT_EQ(cuda::MatmulForward(ctx_, gout.get(), gx.get(), gw.get(),
                                  with_bias ? gbias.get() : nullptr, N, C, OC),
              CUBLAS_STATUS_SUCCESS);
    EXPECT_LT(RelErr(gout.Get(), out), kFp32) << "bias " << with_bias;
  }
  auto dout = Random(N * OC, rng_), dinp = Random(N * C, rng_),
       dw = Random(OC * C, rng_), db = Random(OC, rng_);
  Dev<float> gx(x), gw(w), gdout(dout), gdinp(dinp), gdw(dw), gdb(db);
  Dev<float> scratch(cuda::LayerNormScratchFloats(OC));
  MatmulBackwardReference(dinp.data(), dw.data(), db.data(), dout.data(),
                          x.data(), w.data(), N, C, OC);
  ASSERT_EQ(
      cuda::MatmulBackward(ctx_, gdinp.get(), gdw.get(), gdb.get(), gdout.get(),
                           gx.get(), gw.get(), N, C, OC, scratch.get()),
      CUBLAS_STATUS_SUCCESS);
  EXPECT_LT(RelErr(gdinp.Get(), dinp), kFp32);
  EXPECT_LT(RelErr(gdw.Get(), dw), kFp32);
  EXPECT_LT(RelErr(gdb.Get(), db), kFp32);
}

// An N x C2 by OC product's inputs with a bias (wider), and cuBLASLt made
// for ctx (the fixture's TearDown destroys it; null where it could not be
// made).
struct BiasedProduct {
  static constexpr int N = 256, C2 = 192, OC = 576;
  std::vector<float> x, w, bias;
  cuda::LtState* lt;
};
BiasedProduct MakeBiasedProduct(cuda::Ctx* ctx, std::mt19937& rng) {
  constexpr int N = BiasedProduct::N, C2 = BiasedProduct::C2,
                OC = BiasedProduct::OC;
  BiasedProduct p{Random(N * C2, rng), Random(OC * C2, rng),
                  Random(OC, rng, -4, 4), cuda::LtCreate()};
  ctx->lt = p.lt;
  return p;
}

// With cuBLASLt the bias goes in through the product's epilogue: the same
// results as writing the bias rows first, in fp32 (exact) and on bf16
// operands, with cuBLASLt really computing them. A bias below 16-byte
// alignment (which no preference of cuBLASLt's covers) takes the other
// path, and output rows at a 4-byte offset get an algorithm for it.
TEST_F(KernelsTest, MatmulBiasInTheEpilogue) {
  constexpr int N = BiasedProduct::N, C2 = BiasedProduct::C2,
                OC = BiasedProduct::OC;
  const BiasedProduct p = MakeBiasedProduct(&ctx_, rng_);
  ASSERT_NE(p.lt, nullptr);
  cuda::LtState* lt = p.lt;
  const std::vector<float>&x = p.x, &w = p.w, &bias = p.bias;
  std::vector<float> out(N * OC);
  MatmulForwardReference(out.data(), x.data(), w.data(), bias.data(), N, C2,
                         OC);
  Dev<float> gx(x), gw(w), gbias(bias);
  Dev<__nv_bfloat16> a(N * C2), b(OC * C2);
  for (bool bf16 : {false, true}) {
    SCOPED_TRACE(bf16 ? "bf16" : "fp32");
    if (bf16) SixteenBit(CUDA_R_16BF, a.get(), N * C2, b.get(), OC * C2);
    std::vector<std::vector<float>> results;
    for (bool with_lt : {true, false}) {
      ctx_.lt = with_lt ? lt : nullptr;
      Dev<float> gout(N * OC);
      const cublasStatus_t st = cuda::MatmulForward(
          ctx_, gout.get(), gx.get(), gw.get(), gbias.get(), N, C2, OC);
      ctx_.lt = lt;
      ASSERT_EQ(st, CUBLAS_STATUS_SUCCESS);
      results.push_back(gout.Get());
    }
    EXPECT_LT(RelErr(results[0], out), bf16 ? 1e-2 : kFp32);
    EXPECT_LT(RelErr(results[0], results[1]), bf16 ? 1e-5 : 1e-6);
  }
  EXPECT_EQ(cuda::LtShapesTaken(lt), 2);  // fp32 and bf16
  // Straight through cuBLASLt (fp32), at an output 4 bytes off alignment;
  // a bias 4 bytes off is refused.
  Dev<float> gout(N * OC + 1);
  ctx_.operands = CUDA_R_32F;
  EXPECT_TRUE(cuda::LtGemmBias(ctx_, false, true, N, OC, C2, gx.get(), C2,
                               gw.get(), C2, CUDA_R_32F, CUBLAS_COMPUTE_32F,
                               gbias.get(), gout.get() + 1, OC));
  std::vector<float> got = gout.Get();
  got.erase(got.begin());
  EXPECT_LT(RelErr(got, out), kFp32);
  Dev<float> shifted(N * OC), bias1(std::vector<float>(OC + 1, 0.0f));
  EXPECT_FALSE(cuda::LtGemmBias(ctx_, false, true, N, OC, C2, gx.get(), C2,
                                gw.get(), C2, CUDA_R_32F, CUBLAS_COMPUTE_32F,
                                bias1.get() + 1, shifted.get(), OC));
}

// A product asked for a bf16 result too (the engine's qkv, which the fused
// attention reads in bf16): the same bits as rounding its fp32 result,
// which it also writes, with cuBLASLt's epilogue and without, on bf16 and
// on fp16 operands (the result is bf16 either way).
TEST_F(KernelsTest, MatmulWritesItsResultInBf16) {
  constexpr int N = BiasedProduct::N, C2 = BiasedProduct::C2,
                OC = BiasedProduct::OC;
  const BiasedProduct p = MakeBiasedProduct(&ctx_, rng_);
  ASSERT_NE(p.lt, nullptr);
  cuda::LtState* lt = p.lt;
  Dev<float> gx(p.x), gw(p.w), gbias(p.bias);
  Dev<uint16_t> a(N * C2), b(OC * C2);
  for (cudaDataType_t type : {CUDA_R_16BF, CUDA_R_16F}) {
    for (bool with_lt : {false, true}) {
      SCOPED_TRACE(std::string(type == CUDA_R_16BF ? "bf16" : "fp16") +
                   (with_lt ? ", cuBLASLt" : ""));
      SixteenBit(type, a.get(), N * C2, b.get(), OC * C2);
      cuda::Ctx ctx = ctx_;
      ctx.lt = with_lt ? lt : nullptr;
      Dev<float> gout(N * OC), again(N * OC);
      Dev<uint16_t> expected(N * OC),
          got(std::vector<uint16_t>(N * OC, 0xFFFF));
      ASSERT_EQ(cuda::MatmulForward(ctx, gout.get(), gx.get(), gw.get(),
                                    gbias.get(), N, C2, OC),
                CUBLAS_STATUS_SUCCESS);
      cuda::To16Bit(ctx, CUDA_R_16BF, expected.get(), gout.get(), N * OC);
      ASSERT_EQ(cuda::MatmulForward(ctx, again.get(), gx.get(), gw.get(),
                                    gbias.get(), N, C2, OC, got.get()),
                CUBLAS_STATUS_SUCCESS);
      EXPECT_EQ(again.Get(), gout.Get());
      EXPECT_EQ(got.Get(), expected.Get());
    }
  }
}

// The bf16 products are within bf16's error and really on bf16 operands
// (tf32 ones, 3 more mantissa bits, come out about 8 times closer; fp32
// ones 1000 times).
TEST_F(KernelsTest, MatmulBf16) {
  const int N = 256, C2 = 768, OC = 512;
  auto x = Random(N * C2, rng_), w = Random(OC * C2, rng_);
  std::vector<float> out(N * OC);
  MatmulForwardReference(out.data(), x.data(), w.data(), nullptr, N, C2, OC);
  Dev<float> gx(x), gw(w), gout(N * OC);
  Dev<__nv_bfloat16> a(N * C2), b(OC * C2);
  SixteenBit(CUDA_R_16BF, a.get(), N * C2, b.get(),
             OC * C2 - 1);  // one short: refused
  EXPECT_EQ(cuda::MatmulForward(ctx_, gout.get(), gx.get(), gw.get(), nullptr,
                                N, C2, OC),
            CUBLAS_STATUS_INVALID_VALUE);
  ctx_.operand_b_elems = OC * C2;
  ASSERT_EQ(cuda::MatmulForward(ctx_, gout.get(), gx.get(), gw.get(), nullptr,
                                N, C2, OC),
            CUBLAS_STATUS_SUCCESS);
  const double err = RelErr(gout.Get(), out);
  std::printf("bf16 matmul relative error %.3g\n", err);
  EXPECT_LT(err, 1e-2);
  EXPECT_GT(err, 1e-3);  // tf32 operands would be within about 3e-4
}

// fp16 operands: 3 more mantissa bits than bf16 (an error near tf32's), and
// past 65504 infinite, which is how the trainer's loss scaling sees an
// overflow.
TEST_F(KernelsTest, MatmulFp16) {
  const int N = 256, C2 = 768, OC = 512;
  auto x = Random(N * C2, rng_), w = Random(OC * C2, rng_);
  std::vector<float> out(N * OC);
  MatmulForwardReference(out.data(), x.data(), w.data(), nullptr, N, C2, OC);
  Dev<float> gx(x), gw(w), gout(N * OC);
  Dev<__half> a(N * C2), b(OC * C2);
  SixteenBit(CUDA_R_16F, a.get(), N * C2, b.get(), OC * C2);
  ASSERT_EQ(cuda::MatmulForward(ctx_, gout.get(), gx.get(), gw.get(), nullptr,
                                N, C2, OC),
            CUBLAS_STATUS_SUCCESS);
  const double err = RelErr(gout.Get(), out);
  std::printf("fp16 matmul relative error %.3g\n", err);
  EXPECT_LT(err, 1e-3);
  EXPECT_GT(err, 1e-5);
  x[5] = 1e5f;  // row 0 overflows fp16
  Dev<float> gx2(x), gout2(N * OC);
  ASSERT_EQ(cuda::MatmulForward(ctx_, gout2.get(), gx2.get(), gw.get(), nullptr,
                                N, C2, OC),
            CUBLAS_STATUS_SUCCESS);
  const std::vector<float> o = gout2.Get();
  EXPECT_FALSE(std::isfinite(o[0]));
  EXPECT_TRUE(std::isfinite(o[OC]));  // row 1 does not
}

// In the 16-bit modes MatmulBackward rounds dout once for both products
// (and, with a bias, in the pass that sums the bias gradient): the same
// bits as the two products rounding it each, and the fp32 path's bias
// gradient. The A operand is NaN before each call, so any element the
// rounding misses shows; N passes the column sums' 512-row stride and OC
// is not a multiple of their 32 columns. An A operand too small for dout
// is refused, with nothing changed.
TEST_F(KernelsTest, MatmulBackwardRoundsDoutOnce) {
  const int N = 600, C2 = 192, OC = 580;
  auto x = Random(N * C2, rng_), w = Random(OC * C2, rng_),
       dout = Random(N * OC, rng_), dinp0 = Random(N * C2, rng_),
       dw0 = Random(OC * C2, rng_), db0 = Random(OC, rng_);
  Dev<float> gx(x), gw(w), gdout(dout);
  Dev<float> scratch(cuda::LayerNormScratchFloats(OC));
  Dev<float> db32(db0), dinp32(dinp0), dw32(dw0);
  ASSERT_EQ(cuda::MatmulBackward(ctx_, dinp32.get(), dw32.get(), db32.get(),
                                 gdout.get(), gx.get(), gw.get(), N, C2, OC,
                                 scratch.get()),
            CUBLAS_STATUS_SUCCESS);
  const size_t a_elems = static_cast<size_t>(N) * OC;
  const size_t b_elems = static_cast<size_t>(std::max(OC, N)) * C2;
  Dev<uint16_t> a(a_elems), b(b_elems);
  for (cudaDataType_t type : {CUDA_R_16BF, CUDA_R_16F}) {
    SCOPED_TRACE(type == CUDA_R_16BF ? "bf16" : "fp16");
    SixteenBit(type, a.get(), a_elems, b.get(), b_elems);
    Dev<float> dinp_e(dinp0), dw_e(dw0);
    ASSERT_EQ(cuda::RowGemm(ctx_, false, false, N, C2, OC, 1.0f, gdout.get(),
                            OC, gw.get(), C2, 1.0f, dinp_e.get(), C2),
              CUBLAS_STATUS_SUCCESS);
    ASSERT_EQ(cuda::RowGemm(ctx_, true, false, OC, C2, N, 1.0f, gdout.get(), OC,
                            gx.get(), C2, 1.0f, dw_e.get(), C2),
              CUBLAS_STATUS_SUCCESS);
    for (bool with_bias : {true, false}) {
      SCOPED_TRACE(with_bias ? "bias" : "no bias");
      CUDA_OK(cudaMemset(a.get(), 0xFF, a_elems * sizeof(uint16_t)));
      Dev<float> dinp(dinp0), dw(dw0), db(db0);
      ASSERT_EQ(cuda::MatmulBackward(
                    ctx_, dinp.get(), dw.get(), with_bias ? db.get() : nullptr,
                    gdout.get(), gx.get(), gw.get(), N, C2, OC, scratch.get()),
                CUBLAS_STATUS_SUCCESS);
      EXPECT_EQ(dinp.Get(), dinp_e.Get());
      EXPECT_EQ(dw.Get(), dw_e.Get());
      EXPECT_EQ(db.Get(), with_bias ? db32.Get() : db0);
      EXPECT_GT(RelErr(dinp.Get(), dinp32.Get()), 1e-5);  // 16-bit operands
    }
  }
  ctx_.operand_a_elems = a_elems - 1;
  Dev<float> dinp(dinp0), dw(dw0), db(db0);
  EXPECT_EQ(
      cuda::MatmulBackward(ctx_, dinp.get(), dw.get(), db.get(), gdout.get(),
                           gx.get(), gw.get(), N, C2, OC, scratch.get()),
      CUBLAS_STATUS_INVALID_VALUE);
  EXPECT_EQ(db.Get(), db0);
  EXPECT_EQ(dinp.Get(), dinp0);
}

// A product's operand already rounded (Operand::Rounded) gives the same
// bits as the fp32 one that the product rounds itself, forward (bias in
// cuBLASLt's epilogue or not) and backward. A rounded operand in the fp32
// modes, or one sitting in the scratch the other operand is about to be
// rounded into, is refused with nothing written.
TEST_F(KernelsTest, ProductsTakeRoundedOperands) {
  cuda::LtState* lt = cuda::LtCreate();
  ASSERT_NE(lt, nullptr);
  ctx_.lt = lt;  // TearDown's to destroy
  const int N = 256, C2 = 192, OC = 576;
  auto x = Random(N * C2, rng_), w = Random(OC * C2, rng_),
       bias = Random(OC, rng_), dout = Random(N * OC, rng_),
       dinp0 = Random(N * C2, rng_), dw0 = Random(OC * C2, rng_),
       db0 = Random(OC, rng_);
  Dev<float> gx(x), gw(w), gbias(bias), gdout(dout);
  Dev<float> scratch(cuda::LayerNormScratchFloats(OC));
  const size_t a_elems = static_cast<size_t>(N) * OC,
               b_elems = static_cast<size_t>(OC) * C2;
  Dev<uint16_t> a(a_elems), b(b_elems), x16(N * C2);
  for (cudaDataType_t type : {CUDA_R_16BF, CUDA_R_16F}) {
    SCOPED_TRACE(type == CUDA_R_16BF ? "bf16" : "fp16");
    SixteenBit(type, a.get(), a_elems, b.get(), b_elems);
    cuda::To16Bit(ctx_, type, x16.get(), gx.get(), N * C2);
    const cuda::Operand rx = cuda::Operand::Rounded(x16.get());
    for (bool with_lt : {true, false}) {
      for (bool with_bias : {true, false}) {
        SCOPED_TRACE(std::string(with_lt ? "cuBLASLt" : "cuBLAS") +
                     (with_bias ? ", bias" : ", no bias"));
        ctx_.lt = with_lt ? lt : nullptr;
        const float* bp = with_bias ? gbias.get() : nullptr;
        Dev<float> o32(N * OC), o16(N * OC);
        ASSERT_EQ(cuda::MatmulForward(ctx_, o32.get(), gx.get(), gw.get(), bp,
                                      N, C2, OC),
                  CUBLAS_STATUS_SUCCESS);
        // NaN where the fp32 input was rounded: the rounded one is read.
        CUDA_OK(cudaMemset(a.get(), 0xFF, a_elems * sizeof(uint16_t)));
        ASSERT_EQ(
            cuda::MatmulForward(ctx_, o16.get(), rx, gw.get(), bp, N, C2, OC),
            CUBLAS_STATUS_SUCCESS);
        ctx_.lt = lt;
        EXPECT_EQ(o16.Get(), o32.Get());
      }
    }
    // Backward: the weight's gradient from the rounded input.
    Dev<float> dinp32(dinp0), dw32(dw0), db32(db0);
    Dev<float> dinp16(dinp0), dw16(dw0), db16(db0);
    ASSERT_EQ(cuda::MatmulBackward(ctx_, dinp32.get(), dw32.get(), db32.get(),
                                   gdout.get(), gx.get(), gw.get(), N, C2, OC,
                                   scratch.get()),
              CUBLAS_STATUS_SUCCESS);
    ASSERT_EQ(cuda::MatmulBackward(ctx_, dinp16.get(), dw16.get(), db16.get(),
                                   gdout.get(), rx, gw.get(), N, C2, OC,
                                   scratch.get()),
              CUBLAS_STATUS_SUCCESS);
    EXPECT_EQ(dinp16.Get(), dinp32.Get());
    EXPECT_EQ(dw16.Get(), dw32.Get());
    EXPECT_EQ(db16.Get(), db32.Get());
    // A rounded input where the weight is about to be rounded (for dinp).
    Dev<float> dw(dw0);
    EXPECT_EQ(cuda::MatmulBackward(ctx_, dinp16.get(), dw.get(), nullptr,
                                   gdout.get(), cuda::Operand::Rounded(b.get()),
                                   gw.get(), N, C2, OC, scratch.get()),
              CUBLAS_STATUS_INVALID_VALUE);
    EXPECT_EQ(dw.Get(), dw0);
    // B rounded in operand_a while the fp32 A is to be rounded there.
    Dev<float> c(std::vector<float>(N * OC, 5.0f));
    EXPECT_EQ(
        cuda::RowGemm(ctx_, false, true, N, OC, C2, 1.0f, gx.get(), C2,
                      cuda::Operand::Rounded(a.get()), C2, 0.0f, c.get(), OC),
        CUBLAS_STATUS_INVALID_VALUE);
    EXPECT_EQ(c.Get(), std::vector<float>(N * OC, 5.0f));
  }
  // The fp32 modes take fp32 operands only.
  ctx_.operands = CUDA_R_32F;
  const cuda::Operand rx = cuda::Operand::Rounded(x16.get());
  Dev<float> o(std::vector<float>(N * OC, 5.0f));
  Dev<float> dinp(dinp0), dw(dw0), db(db0);
  EXPECT_EQ(
      cuda::MatmulForward(ctx_, o.get(), rx, gw.get(), gbias.get(), N, C2, OC),
      CUBLAS_STATUS_INVALID_VALUE);
  EXPECT_EQ(
      cuda::MatmulBackward(ctx_, dinp.get(), dw.get(), db.get(), gdout.get(),
                           rx, gw.get(), N, C2, OC, scratch.get()),
      CUBLAS_STATUS_INVALID_VALUE);
  EXPECT_EQ(o.Get(), std::vector<float>(N * OC, 5.0f));
  EXPECT_EQ(dinp.Get(), dinp0);
  EXPECT_EQ(dw.Get(), dw0);
  EXPECT_EQ(db.Get(), db0);
}

}  // namespace
}  // namespace dslaunch::worker
