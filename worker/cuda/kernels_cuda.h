// CUDA kernels of the GPT-2 forward and backward pass: the same functions,
// contracts and conventions as worker/kernels_cpu.h (which stays their
// reference; tests/cuda/ compares every one), over
// device pointers, on one stream. Row-major activations (B, T, C), weights
// (OC, C); backward functions ACCUMULATE (+=) into what they produce unless
// the comment says "writes".
//
// Every reduction runs in an order fixed by the shapes alone (no atomics):
// the same inputs give the same bits on every run, so training on the GPU is
// deterministic run to run.
#pragma once

#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

namespace dslaunch::worker::cuda {

// cuBLASLt's handle, workspace and the algorithm chosen for each shape
// (lt_gemm.cc), for the products that add a bias.
struct LtState;

// Where the kernels run and how the matrix products compute.
struct Ctx {
  cudaStream_t stream = nullptr;
  cublasHandle_t blas = nullptr;
  // RowGemm: CUBLAS_COMPUTE_32F (exact fp32) or _32F_FAST_TF32, on fp32
  // operands; or, with `operands` CUDA_R_16BF or CUDA_R_16F, the operands
  // rounded to bf16 or fp16 into the two scratch buffers first (2 bytes an
  // element) and multiplied on the tensor cores with fp32 sums (PyTorch's
  // autocast does the same rounding).
  cublasComputeType_t compute = CUBLAS_COMPUTE_32F;
  cudaDataType_t operands = CUDA_R_32F;
  void* operand_a = nullptr;  // RowGemm's A, operand_a_elems capacity
  void* operand_b = nullptr;  // RowGemm's B
  size_t operand_a_elems = 0, operand_b_elems = 0;
  // RowGemmBatched (attention's products) stays on fp32 operands with this.
  cublasComputeType_t batched_compute = CUBLAS_COMPUTE_32F;
  // Attention by the fused kernels (flash_attention.cuh, bf16 operands)
  // where the head size allows; else the batched products.
  bool fused_attention = false;
  // With cuBLASLt (LtCreate), MatmulForward adds the bias in the product's
  // epilogue; without, or for a shape cuBLASLt has no algorithm for, the
  // bias rows are written first and the product adds to them.
  LtState* lt = nullptr;
};

// cuBLASLt's state: nullptr where it cannot be made (the other path then).
LtState* LtCreate();
void LtDestroy(LtState* lt);
// The shapes cuBLASLt has taken an algorithm for so far (for tests).
int LtShapesTaken(LtState* lt);
// Row-major C[M,N] (writes) = op(A) op(B) + bias[column] through ctx.lt, on
// A and B of `type` computed as `compute`; false, with C to be written by
// another path, where ctx.lt is null or cuBLASLt takes no algorithm for the
// shape or fails.
bool LtGemmBias(const Ctx& ctx, bool trans_a, bool trans_b, int M, int N, int K,
                const void* A, int lda, const void* B, int ldb,
                cudaDataType_t type, cublasComputeType_t compute,
                const float* bias, float* C, int ldc);

// A product's operand: fp32 (in the 16-bit modes rounded into the
// context's scratch for A or B first), or, in the 16-bit modes only,
// already rounded to ctx.operands by whatever wrote it (a LayerNorm, GELU
// or the classifier writing 16-bit output), read as it is.
struct Operand {
  const float* fp32 = nullptr;
  const void* rounded = nullptr;
  Operand(const float* p) : fp32(p) {}  // NOLINT: implicit, as fp32
  static Operand Rounded(const void* p) {
    Operand o(nullptr);
    o.rounded = p;
    return o;
  }
};

// C[M,N] = alpha op(A) op(B) + beta C, row-major, as worker/kernels_cpu.h's
// Gemm (cblas_sgemm's contract). In the 16-bit modes an fp32 A (B) is
// rounded into ctx.operand_a (operand_b) and must fit there (each as many
// rows as it has, times its leading dimension); a rounded A must not be
// operand_b while B is rounded into it (nor B operand_a while A is).
// CUBLAS_STATUS_INVALID_VALUE otherwise, or for a rounded operand in the
// fp32 modes, with nothing written.
cublasStatus_t RowGemm(const Ctx& ctx, bool trans_a, bool trans_b, int M, int N,
                       int K, float alpha, Operand A, int lda, Operand B,
                       int ldb, float beta, float* C, int ldc);
// The same over `batch` matrices, each the last one's address + stride.
cublasStatus_t RowGemmBatched(const Ctx& ctx, bool trans_a, bool trans_b, int M,
                              int N, int K, float alpha, const float* A,
                              int lda, long long stride_a, const float* B,
                              int ldb, long long stride_b, float beta, float* C,
                              int ldc, long long stride_c, int batch);

void EncoderForward(const Ctx& ctx, float* out, const int* inp,
                    const float* wte, const float* wpe, int B, int T, int C);
// dwpe[t,:] += sum_b dout[b,t,:].
void EncoderBackwardWpe(const Ctx& ctx, float* dwpe, const float* dout, int B,
                        int T, int C);
// dwte[tokens[u],:] += sum of dout rows positions[offsets[u] ..
// offsets[u+1]) for u < n_unique: the batch's tokens grouped by value
// (EncoderGroups builds the groups on the host), so no two threads add into
// one row and the sum's order is fixed.
void EncoderBackwardWte(const Ctx& ctx, float* dwte, const float* dout,
                        const int* tokens, const int* offsets,
                        const int* positions, int n_unique, int C);

// With out16 in a 16-bit mode the output goes there rounded to
// ctx.operands (the same bits as rounding the fp32 output), and out (which
// may be null) is not written; out16 must not overlap the input.
void LayerNormForward(const Ctx& ctx, float* out, float* mean, float* rstd,
                      const float* inp, const float* weight, const float* bias,
                      int N, int C, void* out16 = nullptr);
// res = inp1 + inp2 (ResidualForward's) and LayerNormForward over it, in
// one pass: the same bits as the two.
void ResidualLayerNormForward(const Ctx& ctx, float* res, float* out,
                              float* mean, float* rstd, const float* inp1,
                              const float* inp2, const float* weight,
                              const float* bias, int N, int C,
                              void* out16 = nullptr);
// scratch: LayerNormScratchFloats(C) floats.
void LayerNormBackward(const Ctx& ctx, float* dinp, float* dweight,
                       float* dbias, const float* dout, const float* inp,
                       const float* weight, const float* mean,
                       const float* rstd, int N, int C, float* scratch);
size_t LayerNormScratchFloats(int C);

// out[N,OC] = inp[N,C] @ weight[OC,C]^T + bias (bias may be null). With
// out_bf16, also rounded to bf16 there. (cuBLASLt's epilogue cannot write
// bf16 itself here: its bias must then be bf16 too, which would round the
// bias before the sum.)
cublasStatus_t MatmulForward(const Ctx& ctx, float* out, Operand inp,
                             const float* weight, const float* bias, int N,
                             int C, int OC, void* out_bf16 = nullptr);
// dinp = dout @ weight + dinp_beta * dinp (1 adds, 0 writes);
// dweight += dout^T @ inp; dbias += column sums of dout. dinp, dbias may be
// null. scratch: LayerNormScratchFloats(OC). In the 16-bit modes dout is
// rounded into ctx.operand_a (unless it comes rounded, and then without
// dbias: GeluBackwardBias summed it) and the weight into operand_b (for
// dinp), so a rounded inp (or dout) where it would be overwritten is
// refused.
cublasStatus_t MatmulBackward(const Ctx& ctx, float* dinp, float* dweight,
                              float* dbias, Operand dout, Operand inp,
                              const float* weight, int N, int C, int OC,
                              float* scratch, float dinp_beta = 1.0f);

// Causal self-attention over qkv (B, T, 3C), as kernels_cpu.h's: out
// (B, T, C), lse (B, NH, T). With ctx.fused_attention and a head size
// FlashAttentionSupported takes, the fused kernels below; else batched
// products through cuBLAS and a softmax kernel, the (B, NH, T, T) scores
// only in the workspace. workspace: AttentionWorkspaceFloats(ctx, ...).
// With out16 in a 16-bit mode, out also rounded to ctx.operands there
// (4-byte aligned). qkv16: for the fused kernels only, qkv already rounded
// to bf16 (16-byte aligned), which they then read as it is (inp unused,
// may be null) instead of rounding inp into the workspace first; the
// batched path refuses it.
cublasStatus_t AttentionForward(const Ctx& ctx, float* out, float* lse,
                                const float* inp, int B, int T, int C, int NH,
                                float* workspace, void* out16 = nullptr,
                                const void* qkv16 = nullptr);
// dinp (B, T, 3C) += the gradient w.r.t. qkv given dout (B, T, C) (with
// add false, written: dinp's old values are not read); out is what
// AttentionForward wrote; qkv16 as there.
cublasStatus_t AttentionBackward(const Ctx& ctx, float* dinp, const float* dout,
                                 const float* inp, const float* out,
                                 const float* lse, int B, int T, int C, int NH,
                                 float* workspace, bool add = true,
                                 const void* qkv16 = nullptr);
// Whether attention at this shape runs through the fused kernels (asked
// for in ctx, and a shape they take), which alone take qkv16.
bool AttentionFused(const Ctx& ctx, int B, int C, int NH);
// (qkv16: for calls that pass it, which the fused kernels need less for.)
size_t AttentionWorkspaceFloats(const Ctx& ctx, int B, int T, int C, int NH,
                                bool qkv16 = false);

// The fused causal attention (flash_attention.cuh): the scores never leave
// the chip, the masked half is skipped, the products run on bf16 operands
// with fp32 sums, and no atomics (the same bits every run). Head sizes 16,
// 32, 64 and 128, B * NH up to 65535, on a GPU whose blocks may take the
// kernels' shared memory (up to 103 KiB); FlashAttentionShape checks the
// shape alone (no device query: what each call checks once the device has
// passed at start). Q, K, V (and dout) are rounded to bf16 once into the
// workspace, FlashAttentionWorkspaceFloats(B, T, C, NH, qkv16) floats
// (16-byte aligned), which the kernels then read at half the bytes; Q, K
// and V not where they come rounded (qkv16, as AttentionForward's: the
// workspace then smaller).
bool FlashAttentionSupported(int B, int C, int NH);
bool FlashAttentionShape(int B, int C, int NH);
size_t FlashAttentionWorkspaceFloats(int B, int T, int C, int NH,
                                     bool qkv16 = false);
cudaError_t FlashAttentionForward(const Ctx& ctx, float* out, float* lse,
                                  const float* inp, int B, int T, int C, int NH,
                                  float* workspace, void* out16 = nullptr,
                                  const void* qkv16 = nullptr);
cudaError_t FlashAttentionBackward(const Ctx& ctx, float* dinp,
                                   const float* dout, const float* inp,
                                   const float* out, const float* lse, int B,
                                   int T, int C, int NH, float* workspace,
                                   bool add = true,
                                   const void* qkv16 = nullptr);

// out = gelu(inp) (tanh form); out may alias inp. With out16 in a 16-bit
// mode, rounded to ctx.operands there instead (out not written, may be
// null); out16 must not overlap inp.
void GeluForward(const Ctx& ctx, float* out, const float* inp, size_t n,
                 void* out16 = nullptr);
// dinp += gelu'(inp) * dout (with add false, dinp = ...: not read).
void GeluBackward(const Ctx& ctx, float* dinp, const float* inp,
                  const float* dout, size_t n, bool add = true);
// GELU's backward feeding a linear layer's, in one pass over (N, C): d =
// gelu'(inp) * dout (GeluBackward's with add false, the same bits) written
// rounded to ctx.operands into `rounded` (N * C elements) in the 16-bit
// modes (else, or without `rounded`, fp32 into out), and dbias += its
// column sums (scratch: LayerNormScratchFloats(C)). The layer's
// MatmulBackward then takes d (Operand::Rounded(rounded), or out) and no
// dbias.
void GeluBackwardBias(const Ctx& ctx, float* out, void* rounded, float* dbias,
                      const float* inp, const float* dout, int N, int C,
                      float* scratch);
// dbias += the column sums of dout (N, C), summed in an order fixed by
// the shape (scratch: LayerNormScratchFloats(C)); with `rounded` in a
// 16-bit mode, dout also rounded to ctx.operands there in the same pass.
void BiasGradient(const Ctx& ctx, float* dbias, const float* dout, int N, int C,
                  float* scratch, void* rounded);
void ResidualForward(const Ctx& ctx, float* out, const float* inp1,
                     const float* inp2, size_t n);
void Zero(const Ctx& ctx, float* p, size_t n);
// p *= s (the same rounding as the CPU's p[i] *= s).
void Scale(const Ctx& ctx, float* p, size_t n, float s);
// out = in rounded to bf16 or fp16 (type CUDA_R_16BF or CUDA_R_16F;
// nearest even; fp16 overflows to infinity past 65504).
void To16Bit(const Ctx& ctx, cudaDataType_t type, void* out, const float* in,
             size_t n);

// The classifier in one pass per row: losses[i] = -log softmax(logits[i])
// [targets[i]] over the first V of Vp columns; with backward, WRITES
// logits[i] = dloss * (softmax - onehot) in place (padding columns 0), so
// the probabilities are never stored. Without backward the logits stay.
// With `rounded` (16-bit modes), the gradient goes there instead, rounded
// to ctx.operands, for the head's products (Operand::Rounded); the logits
// stay.
void FusedClassifier(const Ctx& ctx, float* logits, float* losses,
                     const int* targets, int N, int V, int Vp, float dloss,
                     bool backward, void* rounded = nullptr);

// One AdamW (adamw true) or Adam-with-L2 step over n elements, the same
// operations in the same order as worker/cpu_adam.h's AdamStep (so the same
// bits), after grads are multiplied by grad_scale (1: untouched). The fp32
// constants come from the host: decay_mul = f(1 - lr*wd) (AdamW) or f(wd)
// (L2), b1, one_minus_b1, b2, one_minus_b2, sqrt_bc2 = f(sqrt(1 - b2^t)),
// eps, neg_step = f(-lr / (1 - b1^t)).
struct AdamConstants {
  float decay_mul, b1, one_minus_b1, b2, one_minus_b2, sqrt_bc2, eps, neg_step;
  bool adamw, decay;
};
// The constants of step `step` (1-based), each rounded from double to fp32
// once as worker/cpu_adam.cc rounds them; `decay` false for ranges that do
// not decay.
AdamConstants MakeAdamConstants(double lr, double beta1, double beta2,
                                double eps, double weight_decay, bool adamw,
                                int64_t step, bool decay);
void AdamStep(const Ctx& ctx, float* params, const float* grads, float* m,
              float* v, size_t n, const AdamConstants& k, float grad_scale);

// Per-block partial sums of squares (double) of g[0, n): kSquaredSumBlocks
// values into partials, summed on the host in order.
inline constexpr int kSquaredSumBlocks = 264;
void SquaredSumPartials(const Ctx& ctx, const float* g, size_t n,
                        double* partials);

}  // namespace dslaunch::worker::cuda
