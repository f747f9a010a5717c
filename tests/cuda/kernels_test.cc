// The CUDA kernels against the CPU's, their reference (ctest label gpu;
// every test skips, saying why, where no GPU is visible; the trainer on the
// GPU is in trainer_test.cc):
//  - Every kernel of worker/cuda/kernels_cuda.h, forward and backward, on
//    fresh random inputs against worker/kernels_cpu.h: fp32 within 1e-5
//    relative (L2 norm of the difference over that of the reference);
//    AdamW bit for bit; the bf16 products within 1e-2 (bf16 keeps 8
//    significant bits: each operand is off by up to 2^-9 relative, and a
//    sum over K products averages those errors to a few 1e-3).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "tests/cuda/kernels_test_util.h"
#include "worker/cpu_adam.h"
#include "worker/cuda/kernels_cuda.h"
#include "worker/kernels_cpu.h"

namespace dslaunch::worker {
namespace {

TEST_F(KernelsTest, Encoder) {
  const int N = B * T;
  std::vector<int> tok(N);
  for (int& t : tok) t = rng_() % 7;  // repeats: rows shared by many tokens
  auto wte = Random(V * C, rng_), wpe = Random(T * C, rng_);
  std::vector<float> out(N * C);
  EncoderForward(out.data(), tok.data(), wte.data(), wpe.data(), B, T, C);
  Dev<int> dtok(tok);
  Dev<float> dwte_p(wte), dwpe_p(wpe), dout(N * C);
  cuda::EncoderForward(ctx_, dout.get(), dtok.get(), dwte_p.get(), dwpe_p.get(),
                       B, T, C);
  EXPECT_LT(RelErr(dout.Get(), out), kFp32);

  auto grad = Random(N * C, rng_);
  auto dwte = Random(V * C, rng_), dwpe = Random(T * C, rng_);
  Dev<float> gdwte(dwte), gdwpe(dwpe), ggrad(grad);
  EncoderBackward(dwte.data(), dwpe.data(), grad.data(), tok.data(), B, T, C);
  // Groups as the engine builds them: each token's positions ascending.
  std::vector<int> tokens, offsets, positions;
  for (int v = 0; v < 7; v++) {
    std::vector<int> pos;
    for (int i = 0; i < N; i++)
      if (tok[i] == v) pos.push_back(i);
    if (pos.empty()) continue;
    tokens.push_back(v);
    offsets.push_back(static_cast<int>(positions.size()));
    positions.insert(positions.end(), pos.begin(), pos.end());
  }
  offsets.push_back(static_cast<int>(positions.size()));
  Dev<int> gt(tokens), go(offsets), gp(positions);
  cuda::EncoderBackwardWpe(ctx_, gdwpe.get(), ggrad.get(), B, T, C);
  cuda::EncoderBackwardWte(ctx_, gdwte.get(), ggrad.get(), gt.get(), go.get(),
                           gp.get(), static_cast<int>(tokens.size()), C);
  EXPECT_LT(RelErr(gdwte.Get(), dwte), kFp32);
  EXPECT_LT(RelErr(gdwpe.Get(), dwpe), kFp32);
}

TEST_F(KernelsTest, LayerNorm) {
  const int N = B * T;
  auto x = Random(N * C, rng_, -3, 5), w = Random(C, rng_), b = Random(C, rng_);
  std::vector<float> out(N * C), mean(N), rstd(N);
  LayerNormForward(out.data(), mean.data(), rstd.data(), x.data(), w.data(),
                   b.data(), N, C);
  Dev<float> gx(x), gw(w), gb(b), gout(N * C), gmean(N), grstd(N);
  cuda::LayerNormForward(ctx_, gout.get(), gmean.get(), grstd.get(), gx.get(),
                         gw.get(), gb.get(), N, C);
  EXPECT_LT(RelErr(gout.Get(), out), kFp32);
  EXPECT_LT(RelErr(gmean.Get(), mean), kFp32);
  EXPECT_LT(RelErr(grstd.Get(), rstd), kFp32);

  auto dout = Random(N * C, rng_), dinp = Random(N * C, rng_);
  auto dw = Random(C, rng_), db = Random(C, rng_);
  Dev<float> gdout(dout), gdinp(dinp), gdw(dw), gdb(db);
  Dev<float> scratch(cuda::LayerNormScratchFloats(C));
  LayerNormBackward(dinp.data(), dw.data(), db.data(), dout.data(), x.data(),
                    w.data(), mean.data(), rstd.data(), N, C);
  cuda::LayerNormBackward(ctx_, gdinp.get(), gdw.get(), gdb.get(), gdout.get(),
                          gx.get(), gw.get(), gmean.get(), grstd.get(), N, C,
                          scratch.get());
  EXPECT_LT(RelErr(gdinp.Get(), dinp), kFp32);
  EXPECT_LT(RelErr(gdw.Get(), dw), kFp32);
  EXPECT_LT(RelErr(gdb.Get(), db), kFp32);
}

// The residual and the LayerNorm over it in one pass: the same bits as
// ResidualForward then LayerNormForward.
TEST_F(KernelsTest, ResidualLayerNormIsTheTwoInOne) {
  const int N = B * T;
  auto x = Random(N * C, rng_, -3, 5), y = Random(N * C, rng_),
       w = Random(C, rng_), b = Random(C, rng_);
  Dev<float> gx(x), gy(y), gw(w), gb(b);
  Dev<float> res(N * C), out(N * C), mean(N), rstd(N);
  cuda::ResidualForward(ctx_, res.get(), gx.get(), gy.get(),
                        static_cast<size_t>(N) * C);
  cuda::LayerNormForward(ctx_, out.get(), mean.get(), rstd.get(), res.get(),
                         gw.get(), gb.get(), N, C);
  Dev<float> res2(N * C), out2(N * C), mean2(N), rstd2(N);
  cuda::ResidualLayerNormForward(ctx_, res2.get(), out2.get(), mean2.get(),
                                 rstd2.get(), gx.get(), gy.get(), gw.get(),
                                 gb.get(), N, C);
  EXPECT_EQ(res2.Get(), res.Get());
  EXPECT_EQ(out2.Get(), out.Get());
  EXPECT_EQ(mean2.Get(), mean.Get());
  EXPECT_EQ(rstd2.Get(), rstd.Get());
}

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

// With cuBLASLt the bias goes in through the product's epilogue: the same
// results as writing the bias rows first, in fp32 (exact) and on bf16
// operands, with cuBLASLt really computing them. A bias below 16-byte
// alignment (which no preference of cuBLASLt's covers) takes the other
// path, and output rows at a 4-byte offset get an algorithm for it.
TEST_F(KernelsTest, MatmulBiasInTheEpilogue) {
  cuda::LtState* lt = cuda::LtCreate();
  ASSERT_NE(lt, nullptr);
  ctx_.lt = lt;  // TearDown's to destroy
  const int N = 256, C2 = 192, OC = 576;
  auto x = Random(N * C2, rng_), w = Random(OC * C2, rng_),
       bias = Random(OC, rng_, -4, 4);
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

// A product asked for a bf16 result (the engine's qkv, which the fused
// attention reads in bf16): without cuBLASLt, or on fp16 operands, the
// same bits as rounding the fp32 result; through cuBLASLt's epilogue on
// bf16 operands within one bf16 step of it (the algorithm for a bf16
// output may sum in another order). Whether cuBLASLt took the bf16 output
// is printed: where it does not, the other path serves.
TEST_F(KernelsTest, MatmulWritesItsResultInBf16) {
  cuda::LtState* lt = cuda::LtCreate();
  ASSERT_NE(lt, nullptr);
  ctx_.lt = lt;  // TearDown's to destroy
  const int N = 256, C2 = 192, OC = 576;
  auto x = Random(N * C2, rng_), w = Random(OC * C2, rng_),
       bias = Random(OC, rng_, -4, 4);
  Dev<float> gx(x), gw(w), gbias(bias);
  Dev<uint16_t> a(N * C2), b(OC * C2);
  // bf16 as a float.
  const auto widen = [](uint16_t h) {
    uint32_t u = static_cast<uint32_t>(h) << 16;
    float f;
    std::memcpy(&f, &u, sizeof f);
    return f;
  };
  for (cudaDataType_t type : {CUDA_R_16BF, CUDA_R_16F}) {
    for (bool with_lt : {false, true}) {
      SCOPED_TRACE(std::string(type == CUDA_R_16BF ? "bf16" : "fp16") +
                   (with_lt ? ", cuBLASLt" : ""));
      SixteenBit(type, a.get(), N * C2, b.get(), OC * C2);
      ctx_.lt = with_lt ? lt : nullptr;
      Dev<float> gout(N * OC), scratch(N * OC);
      Dev<uint16_t> expected(N * OC),
          got(std::vector<uint16_t>(N * OC, 0xFFFF));
      ASSERT_EQ(cuda::MatmulForward(ctx_, gout.get(), gx.get(), gw.get(),
                                    gbias.get(), N, C2, OC),
                CUBLAS_STATUS_SUCCESS);
      cuda::To16Bit(ctx_, CUDA_R_16BF, expected.get(), gout.get(), N * OC);
      const int taken = cuda::LtShapesTaken(lt);
      ASSERT_EQ(cuda::MatmulForward(ctx_, scratch.get(), gx.get(), gw.get(),
                                    gbias.get(), N, C2, OC, got.get()),
                CUBLAS_STATUS_SUCCESS);
      const bool direct = cuda::LtShapesTaken(lt) > taken;
      ctx_.lt = lt;
      const std::vector<uint16_t> e = expected.Get(), g = got.Get();
      if (!direct) {
        EXPECT_EQ(g, e);
        continue;
      }
      std::printf("cuBLASLt wrote the bf16 result itself\n");
      EXPECT_EQ(type, CUDA_R_16BF);
      for (size_t i = 0; i < e.size(); ++i) {
        const float want = widen(e[i]), have = widen(g[i]);
        // A step of bf16, and the fp32 sums' own error near zero.
        ASSERT_LE(std::fabs(have - want),
                  std::ldexp(std::fabs(want), -7) + 1e-4f)
            << i;
      }
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

TEST_F(KernelsTest, PointwiseAndResidual) {
  const size_t n = 10007;
  auto x = Random(n, rng_, -4, 4), y = Random(n, rng_), g = Random(n, rng_);
  std::vector<float> out(n), res(n), dinp = Random(n, rng_);
  Dev<float> gx(x), gy(y), gg(g), gout(n), gres(n), gdinp(dinp);
  GeluForward(out.data(), x.data(), n);
  GeluBackward(dinp.data(), x.data(), g.data(), n);
  ResidualForward(res.data(), x.data(), y.data(), n);
  cuda::GeluForward(ctx_, gout.get(), gx.get(), n);
  cuda::GeluBackward(ctx_, gdinp.get(), gx.get(), gg.get(), n);
  cuda::ResidualForward(ctx_, gres.get(), gx.get(), gy.get(), n);
  EXPECT_LT(RelErr(gout.Get(), out), kFp32);
  EXPECT_LT(RelErr(gdinp.Get(), dinp), kFp32);
  EXPECT_EQ(gres.Get(), res);
}

TEST_F(KernelsTest, Classifier) {
  const int N = B * T;
  auto logits = Random(static_cast<size_t>(N) * Vp, rng_, -6, 6);
  std::vector<int> targets(N);
  for (int& t : targets) t = rng_() % V;
  Dev<float> glogits(logits), glosses(N);
  Dev<int> gtargets(targets);
  std::vector<float> probs(logits.size()), losses(N);
  CrossEntropySoftmaxForward(probs.data(), losses.data(), logits.data(),
                             targets.data(), N, V, Vp);
  const float dloss = 1.0f / N;
  CrossEntropySoftmaxBackward(probs.data(), probs.data(), targets.data(), dloss,
                              N, V, Vp);
  cuda::FusedClassifier(ctx_, glogits.get(), glosses.get(), gtargets.get(), N,
                        V, Vp, dloss, true);
  EXPECT_LT(RelErr(glosses.Get(), losses), kFp32);
  EXPECT_LT(RelErr(glogits.Get(), probs), kFp32);
  // Forward only: the losses, the logits untouched.
  Dev<float> g2(logits), l2(N);
  cuda::FusedClassifier(ctx_, g2.get(), l2.get(), gtargets.get(), N, V, Vp, 0,
                        false);
  EXPECT_LT(RelErr(l2.Get(), losses), kFp32);
  EXPECT_EQ(g2.Get(), logits);
}

// In the 16-bit modes the classifier can write the logits' gradient
// straight into the head's A operand: the same bits as rounding the fp32
// gradient, the logits left as they were.
TEST_F(KernelsTest, ClassifierRoundsItsGradientForTheHead) {
  const int N = B * T;
  const size_t n = static_cast<size_t>(N) * Vp;
  auto logits = Random(n, rng_, -6, 6);
  std::vector<int> targets(N);
  for (int& t : targets) t = rng_() % V;
  Dev<int> gtargets(targets);
  Dev<float> fp32(logits), l32(N), kept(logits), l16(N);
  cuda::FusedClassifier(ctx_, fp32.get(), l32.get(), gtargets.get(), N, V, Vp,
                        1.0f / N, true);
  for (cudaDataType_t type : {CUDA_R_16BF, CUDA_R_16F}) {
    // NaN in either type where nothing is written (the padding included).
    Dev<uint16_t> direct(std::vector<uint16_t>(n, 0xFFFF)), expected(n), b(1);
    SixteenBit(type, direct.get(), n, b.get(), 1);
    cuda::FusedClassifier(ctx_, kept.get(), l16.get(), gtargets.get(), N, V, Vp,
                          1.0f / N, true, direct.get());
    cuda::To16Bit(ctx_, type, expected.get(), fp32.get(), n);
    EXPECT_EQ(direct.Get(), expected.Get()) << type;
    EXPECT_EQ(kept.Get(), logits) << type;
    EXPECT_EQ(l16.Get(), l32.Get()) << type;
  }
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

// The 16-bit modes keep the products' activations rounded: a LayerNorm
// (alone or after the residual) and GELU write their output rounded, the
// same bits as rounding their fp32 output, over NaN (so a missed element
// shows) and with no fp32 output; the statistics and the residual are as
// before.
TEST_F(KernelsTest, ActivationsWrittenRounded) {
  const int N = B * T;
  const size_t nc = static_cast<size_t>(N) * C;
  auto x = Random(nc, rng_, -3, 5), y = Random(nc, rng_), w = Random(C, rng_),
       b = Random(C, rng_);
  Dev<float> gx(x), gy(y), gw(w), gb(b);
  Dev<float> out(nc), mean(N), rstd(N), res(nc), rout(nc), rmean(N), rrstd(N),
      gelu(nc);
  cuda::LayerNormForward(ctx_, out.get(), mean.get(), rstd.get(), gx.get(),
                         gw.get(), gb.get(), N, C);
  cuda::ResidualLayerNormForward(ctx_, res.get(), rout.get(), rmean.get(),
                                 rrstd.get(), gx.get(), gy.get(), gw.get(),
                                 gb.get(), N, C);
  cuda::GeluForward(ctx_, gelu.get(), gx.get(), nc);
  for (cudaDataType_t type : {CUDA_R_16BF, CUDA_R_16F}) {
    SCOPED_TRACE(type == CUDA_R_16BF ? "bf16" : "fp16");
    ctx_.operands = type;
    const std::vector<uint16_t> nan(nc, 0xFFFF);  // NaN in either type
    auto rounded = [&](Dev<float>& fp32) {
      Dev<uint16_t> r(nc);
      cuda::To16Bit(ctx_, type, r.get(), fp32.get(), nc);
      return r.Get();
    };
    Dev<uint16_t> ln16(nan), rln16(nan), gelu16(nan);
    Dev<float> m2(N), r2(N), res2(nc), rm2(N), rr2(N);
    cuda::LayerNormForward(ctx_, nullptr, m2.get(), r2.get(), gx.get(),
                           gw.get(), gb.get(), N, C, ln16.get());
    cuda::ResidualLayerNormForward(ctx_, res2.get(), nullptr, rm2.get(),
                                   rr2.get(), gx.get(), gy.get(), gw.get(),
                                   gb.get(), N, C, rln16.get());
    cuda::GeluForward(ctx_, nullptr, gx.get(), nc, gelu16.get());
    EXPECT_EQ(ln16.Get(), rounded(out));
    EXPECT_EQ(m2.Get(), mean.Get());
    EXPECT_EQ(r2.Get(), rstd.Get());
    EXPECT_EQ(rln16.Get(), rounded(rout));
    EXPECT_EQ(res2.Get(), res.Get());
    EXPECT_EQ(rm2.Get(), rmean.Get());
    EXPECT_EQ(rr2.Get(), rrstd.Get());
    EXPECT_EQ(gelu16.Get(), rounded(gelu));
  }
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

// Writing an input gradient (no zeroing first) equals adding it to zeros:
// GELU's backward and attention's (fused and batched) with add false, and
// MatmulBackward with dinp_beta 0, each over NaN (which adding would keep).
// The product may take another algorithm for beta 0, so it is compared
// within 1e-6; the others bit for bit.
TEST_F(KernelsTest, GradientsWrittenEqualAddedToZero) {
  const size_t n = 10007;
  auto x = Random(n, rng_, -4, 4), g = Random(n, rng_);
  Dev<float> gx(x), gg(g), added(std::vector<float>(n, 0.0f)), written(n);
  cuda::GeluBackward(ctx_, added.get(), gx.get(), gg.get(), n);
  cuda::GeluBackward(ctx_, written.get(), gx.get(), gg.get(), n,
                     /*add=*/false);
  EXPECT_EQ(written.Get(), added.Get());

  // Attention: the fixture's head size (batched) and a fused one.
  for (int hs : {C / NH, 64}) {
    SCOPED_TRACE("head size " + std::to_string(hs));
    const int nh = hs == 64 ? 3 : NH, c = nh * hs, t = hs == 64 ? 150 : T;
    ctx_.fused_attention = hs == 64;
    ASSERT_EQ(cuda::FlashAttentionSupported(B, c, nh), hs == 64);
    const size_t rows = static_cast<size_t>(B) * t;
    auto qkv = Random(rows * 3 * c, rng_, -2, 2), dout = Random(rows * c, rng_);
    Dev<float> gqkv(qkv), gdout(dout), out(rows * c), lse(B * nh * t);
    Dev<float> ws(cuda::AttentionWorkspaceFloats(ctx_, B, t, c, nh));
    ASSERT_EQ(cuda::AttentionForward(ctx_, out.get(), lse.get(), gqkv.get(), B,
                                     t, c, nh, ws.get()),
              CUBLAS_STATUS_SUCCESS);
    Dev<float> da(std::vector<float>(rows * 3 * c, 0.0f)), dw(rows * 3 * c);
    ASSERT_EQ(
        cuda::AttentionBackward(ctx_, da.get(), gdout.get(), gqkv.get(),
                                out.get(), lse.get(), B, t, c, nh, ws.get()),
        CUBLAS_STATUS_SUCCESS);
    ASSERT_EQ(cuda::AttentionBackward(ctx_, dw.get(), gdout.get(), gqkv.get(),
                                      out.get(), lse.get(), B, t, c, nh,
                                      ws.get(), /*add=*/false),
              CUBLAS_STATUS_SUCCESS);
    EXPECT_EQ(dw.Get(), da.Get());
  }

  const int N = 600, C2 = 192, OC = 580;
  auto xm = Random(N * C2, rng_), w = Random(OC * C2, rng_),
       dout = Random(N * OC, rng_), dw0 = Random(OC * C2, rng_);
  Dev<float> gxm(xm), gw(w), gdout(dout);
  Dev<float> scratch(cuda::LayerNormScratchFloats(OC));
  const size_t a_elems = static_cast<size_t>(N) * OC,
               b_elems = static_cast<size_t>(std::max(OC, N)) * C2;
  Dev<uint16_t> a(a_elems), b(b_elems);
  for (bool bf16 : {false, true}) {
    SCOPED_TRACE(bf16 ? "bf16" : "fp32");
    if (bf16) SixteenBit(CUDA_R_16BF, a.get(), a_elems, b.get(), b_elems);
    Dev<float> dadd(std::vector<float>(N * C2, 0.0f)), dwrite(N * C2);
    Dev<float> dw1(dw0), dw2(dw0);
    ASSERT_EQ(
        cuda::MatmulBackward(ctx_, dadd.get(), dw1.get(), nullptr, gdout.get(),
                             gxm.get(), gw.get(), N, C2, OC, scratch.get()),
        CUBLAS_STATUS_SUCCESS);
    ASSERT_EQ(cuda::MatmulBackward(ctx_, dwrite.get(), dw2.get(), nullptr,
                                   gdout.get(), gxm.get(), gw.get(), N, C2, OC,
                                   scratch.get(), /*dinp_beta=*/0.0f),
              CUBLAS_STATUS_SUCCESS);
    EXPECT_LT(RelErr(dwrite.Get(), dadd.Get()), 1e-6);
    EXPECT_EQ(dw2.Get(), dw1.Get());
  }
}

// GELU's backward and the next linear layer's bias gradient and rounding
// in one pass (GeluBackwardBias), then that layer's MatmulBackward on the
// d it wrote: the same bits as GeluBackward, then MatmulBackward with the
// bias, in fp32 and in bf16 and fp16 (where d goes rounded straight into
// the A operand, NaN before so a missed element shows). A rounded dout
// with a bias to sum is refused.
TEST_F(KernelsTest, GeluBackwardFeedsTheLinearLayer) {
  const int N = 600, C2 = 192, OC = 580;
  auto x = Random(N * C2, rng_), w = Random(OC * C2, rng_),
       pre = Random(N * OC, rng_, -4, 4), d4 = Random(N * OC, rng_),
       dinp0 = Random(N * C2, rng_), dw0 = Random(OC * C2, rng_),
       db0 = Random(OC, rng_);
  Dev<float> gx(x), gw(w), gpre(pre), gd4(d4);
  Dev<float> scratch(cuda::LayerNormScratchFloats(OC));
  const size_t a_elems = static_cast<size_t>(N) * OC;
  const size_t b_elems = static_cast<size_t>(std::max(OC, N)) * C2;
  Dev<uint16_t> a(a_elems), b(b_elems);
  for (cudaDataType_t type : {CUDA_R_32F, CUDA_R_16BF, CUDA_R_16F}) {
    SCOPED_TRACE(type == CUDA_R_32F    ? "fp32"
                 : type == CUDA_R_16BF ? "bf16"
                                       : "fp16");
    if (type == CUDA_R_32F) {
      ctx_.operands = CUDA_R_32F;
    } else {
      SixteenBit(type, a.get(), a_elems, b.get(), b_elems);
    }
    // Two steps.
    Dev<float> dpre(N * OC), dinp1(dinp0), dw1(dw0), db1(db0);
    cuda::GeluBackward(ctx_, dpre.get(), gpre.get(), gd4.get(), a_elems,
                       /*add=*/false);
    ASSERT_EQ(cuda::MatmulBackward(ctx_, dinp1.get(), dw1.get(), db1.get(),
                                   dpre.get(), gx.get(), gw.get(), N, C2, OC,
                                   scratch.get(), 0.0f),
              CUBLAS_STATUS_SUCCESS);
    // One pass, then the product.
    CUDA_OK(cudaMemset(a.get(), 0xFF, a_elems * sizeof(uint16_t)));
    Dev<float> out(N * OC), dinp2(dinp0), dw2(dw0), db2(db0);
    void* rounded = type == CUDA_R_32F ? nullptr : a.get();
    cuda::GeluBackwardBias(ctx_, out.get(), rounded, db2.get(), gpre.get(),
                           gd4.get(), N, OC, scratch.get());
    const cuda::Operand dout = rounded != nullptr
                                   ? cuda::Operand::Rounded(rounded)
                                   : cuda::Operand(out.get());
    if (rounded != nullptr) {
      Dev<uint16_t> expected(a_elems);
      cuda::To16Bit(ctx_, type, expected.get(), dpre.get(), a_elems);
      EXPECT_EQ(a.Get(), expected.Get());
    } else {
      EXPECT_EQ(out.Get(), dpre.Get());
    }
    ASSERT_EQ(cuda::MatmulBackward(ctx_, dinp2.get(), dw2.get(), nullptr, dout,
                                   gx.get(), gw.get(), N, C2, OC, scratch.get(),
                                   0.0f),
              CUBLAS_STATUS_SUCCESS);
    EXPECT_EQ(db2.Get(), db1.Get());
    EXPECT_EQ(dw2.Get(), dw1.Get());
    EXPECT_EQ(dinp2.Get(), dinp1.Get());
    if (rounded != nullptr) {
      Dev<float> db3(db0);
      EXPECT_EQ(
          cuda::MatmulBackward(ctx_, dinp2.get(), dw2.get(), db3.get(), dout,
                               gx.get(), gw.get(), N, C2, OC, scratch.get()),
          CUBLAS_STATUS_INVALID_VALUE);
      EXPECT_EQ(db3.Get(), db0);
    }
  }
}

TEST_F(KernelsTest, AdamBitForBit) {
  const size_t n = 5003;
  for (bool adamw : {true, false}) {
    for (bool decay : {true, false}) {
      auto p = Random(n, rng_), g = Random(n, rng_),
           m = Random(n, rng_, -.1f, .1f), v = Random(n, rng_, 0, .01f);
      Dev<float> gp(p), gg(g), gm(m), gv(v);
      AdamParams a;
      a.lr = 3e-4;
      a.beta1 = 0.9;
      a.beta2 = 0.95;
      a.eps = 1e-8;
      a.weight_decay = 0.1;
      a.adamw_mode = adamw;
      a.step = 7;
      const float scale = 0.75f;
      for (float& x : g) x *= scale;  // the CPU trainer clips in place first
      AdamStep(p.data(), g.data(), m.data(), v.data(), n, a, decay);
      // The constants the engine makes for such a step.
      const cuda::AdamConstants k = cuda::MakeAdamConstants(
          a.lr, a.beta1, a.beta2, a.eps, a.weight_decay, adamw, 7, decay);
      cuda::AdamStep(ctx_, gp.get(), gg.get(), gm.get(), gv.get(), n, k, scale);
      EXPECT_EQ(gp.Get(), p) << "adamw " << adamw << " decay " << decay;
      EXPECT_EQ(gm.Get(), m);
      EXPECT_EQ(gv.Get(), v);
    }
  }
}

TEST_F(KernelsTest, SquaredSum) {
  const size_t n = 1000003;
  auto g = Random(n, rng_);
  double want = 0;
  for (float x : g) want += static_cast<double>(x) * x;
  Dev<float> gg(g);
  Dev<double> partials(cuda::kSquaredSumBlocks);
  cuda::SquaredSumPartials(ctx_, gg.get(), n, partials.get());
  double got = 0;
  for (double x : partials.Get()) got += x;
  EXPECT_NEAR(got, want, want * 1e-12);
}

}  // namespace
}  // namespace dslaunch::worker
