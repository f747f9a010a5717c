// The CUDA kernels against the CPU's, their reference (ctest label gpu;
// every test skips, saying why, where no GPU is visible; the products are
// in matmul_test.cc, attention in attention_test.cc, the trainer on the
// GPU in trainer_test.cc):
//  - Every other kernel of worker/cuda/kernels_cuda.h, forward and
//    backward, on fresh random inputs against worker/kernels_cpu.h: fp32
//    within 1e-5 relative (L2 norm of the difference over that of the
//    reference); AdamW bit for bit; the 16-bit outputs the same bits as
//    rounding the fp32 ones.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <utility>
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
  // The fixture's (four columns at a time), V not a multiple of 4 (a tail
  // one at a time, as GPT-2's 50257 of 50304), and rows not aligned to four
  // (every column one at a time).
  for (const auto& [v, vp] : {std::pair{V, Vp}, {301, 320}, {301, 303}}) {
    SCOPED_TRACE("V " + std::to_string(v) + " of " + std::to_string(vp));
    auto logits = Random(static_cast<size_t>(N) * vp, rng_, -6, 6);
    std::vector<int> targets(N);
    for (int& t : targets) t = rng_() % v;
    targets[0] = v - 1;  // the last real column
    Dev<float> glogits(logits), glosses(N);
    Dev<int> gtargets(targets);
    std::vector<float> probs(logits.size()), losses(N);
    CrossEntropySoftmaxForward(probs.data(), losses.data(), logits.data(),
                               targets.data(), N, v, vp);
    const float dloss = 1.0f / N;
    CrossEntropySoftmaxBackward(probs.data(), probs.data(), targets.data(),
                                dloss, N, v, vp);
    cuda::FusedClassifier(ctx_, glogits.get(), glosses.get(), gtargets.get(), N,
                          v, vp, dloss, true);
    EXPECT_LT(RelErr(glosses.Get(), losses), kFp32);
    const std::vector<float> grad = glogits.Get();
    EXPECT_LT(RelErr(grad, probs), kFp32);
    for (int r = 0; r < N; ++r) {  // the padding's gradient is 0
      for (int j = v; j < vp; ++j)
        ASSERT_EQ(grad[static_cast<size_t>(r) * vp + j], 0.0f) << r << " " << j;
    }
    // Forward only: the losses, the logits untouched.
    Dev<float> g2(logits), l2(N);
    cuda::FusedClassifier(ctx_, g2.get(), l2.get(), gtargets.get(), N, v, vp, 0,
                          false);
    EXPECT_LT(RelErr(l2.Get(), losses), kFp32);
    EXPECT_EQ(g2.Get(), logits);
  }
}

// In the 16-bit modes the classifier can write the logits' gradient
// straight into the head's A operand: the same bits as rounding the fp32
// gradient, the logits left as they were.
TEST_F(KernelsTest, ClassifierRoundsItsGradientForTheHead) {
  const int N = B * T;
  // The fixture's, and V not a multiple of four (a group of four columns
  // straddling V).
  for (const auto& [v, vp] : {std::pair{V, Vp}, {301, 320}}) {
    SCOPED_TRACE("V " + std::to_string(v) + " of " + std::to_string(vp));
    const size_t n = static_cast<size_t>(N) * vp;
    auto logits = Random(n, rng_, -6, 6);
    std::vector<int> targets(N);
    for (int& t : targets) t = rng_() % v;
    targets[0] = v - 1;
    Dev<int> gtargets(targets);
    Dev<float> fp32(logits), l32(N), kept(logits), l16(N);
    cuda::FusedClassifier(ctx_, fp32.get(), l32.get(), gtargets.get(), N, v, vp,
                          1.0f / N, true);
    for (cudaDataType_t type : {CUDA_R_16BF, CUDA_R_16F}) {
      // NaN in either type where nothing is written (the padding included).
      Dev<uint16_t> direct(std::vector<uint16_t>(n, 0xFFFF)), expected(n), b(1);
      SixteenBit(type, direct.get(), n, b.get(), 1);
      cuda::FusedClassifier(ctx_, kept.get(), l16.get(), gtargets.get(), N, v,
                            vp, 1.0f / N, true, direct.get());
      cuda::To16Bit(ctx_, type, expected.get(), fp32.get(), n);
      EXPECT_EQ(direct.Get(), expected.Get()) << type;
      EXPECT_EQ(kept.Get(), logits) << type;
      EXPECT_EQ(l16.Get(), l32.Get()) << type;
    }
  }
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
