// CPU fp32 kernels of the GPT-2 forward and backward pass (llm.c's
// train_gpt2.c layer set). Stateless free functions over caller-owned
// buffers; each opens its own OpenMP region, so call them from one thread at a
// time per buffer. Results do not depend on the OpenMP thread count: every
// output element is computed by exactly one thread in an order fixed by the
// shapes alone (reductions are split by output element, never by thread; a
// GEMM is cut into tiles chosen from its shape, each tile one single-threaded
// cblas_sgemm call over the whole K). Across machines results may differ in
// the last bits: OpenBLAS and the vector code pick kernels per CPU.
//
// Conventions, as in llm.c: activations are row-major (B, T, C); a weight of
// a linear layer is (OC, C) (PyTorch's nn.Linear); backward functions
// ACCUMULATE (+=) into every gradient they produce (dinp, dweight, dbias)
// unless the comment says "writes". Pointers marked "may be null" skip that
// output.
//
// OpenBLAS must run single-threaded (the OpenMP team supplies the
// parallelism; OpenBLAS's own threads would fight it): the first GEMM or
// attention call makes it so with openblas_set_num_threads(1), process-wide.
#pragma once

#include <cstddef>

namespace dslaunch::worker {

// out[b,t,:] = wte[inp[b,t],:] + wpe[t,:].
// REQUIRES: every inp[i] indexes a row of wte.
void EncoderForward(float* out, const int* inp, const float* wte,
                    const float* wpe, int B, int T, int C);
// dwte[inp[b,t],:] += dout[b,t,:]; dwpe[t,:] += sum_b dout[b,t,:].
void EncoderBackward(float* dwte, float* dwpe, const float* dout,
                     const int* inp, int B, int T, int C);

// Per row of C: out = (inp - mean) * rstd * weight + bias, with
// rstd = 1/sqrt(var + 1e-5) (population variance). mean and rstd (N floats)
// are saved for the backward pass. N = B*T rows.
void LayerNormForward(float* out, float* mean, float* rstd, const float* inp,
                      const float* weight, const float* bias, int N, int C);
void LayerNormBackward(float* dinp, float* dweight, float* dbias,
                       const float* dout, const float* inp, const float* weight,
                       const float* mean, const float* rstd, int N, int C);

enum class Transpose { kNo, kYes };

// C[M,N] = alpha * op(A) op(B) + beta * C, row-major, op(X) = X or X^T
// (cblas_sgemm's contract), on all OpenMP threads: C is cut into at most 4
// tiles chosen from (M, N, K) alone and each tile is one cblas_sgemm call
// with the full K, so every element gets the same bits for any thread count.
void Gemm(Transpose trans_a, Transpose trans_b, int M, int N, int K,
          float alpha, const float* A, int lda, const float* B, int ldb,
          float beta, float* C, int ldc);

// OpenBLAS picks its kernels for the CPU when it is loaded. 0.3.21 (Debian
// 12) does not know newer CPUs (e.g. Xeon Emerald Rapids) and falls back to
// its SSE3 "Prescott" kernels, about 4.5x slower than its AVX-512 ones.
// Returns the OPENBLAS_CORETYPE value that selects the right kernels
// ("SkylakeX" with AVX-512, "Haswell" with AVX2 and FMA) when that happened
// and OPENBLAS_CORETYPE is unset; else nullptr. OpenBLAS reads the variable
// only while loading, so it has to be in the environment the process starts
// with (a launcher sets it, or main() sets it and re-executes itself).
const char* OpenBlasCoretypeOverride();

// out[N,OC] = inp[N,C] @ weight[OC,C]^T + bias[OC] (bias may be null).
// Tiled like Gemm.
void MatmulForward(float* out, const float* inp, const float* weight,
                   const float* bias, int N, int C, int OC);
// dinp += dout @ weight; dweight += dout^T @ inp; dbias += column sums of
// dout. dinp, dbias may be null. The two GEMMs are tiled like Gemm and their
// tiles run in one parallel loop; dweight's tiles are blocks of its own
// (OC, C), each summing over all N rows, so no reduction across threads is
// needed.
void MatmulBackward(float* dinp, float* dweight, float* dbias,
                    const float* dout, const float* inp, const float* weight,
                    int N, int C, int OC);
// Plain-loop references of the two above (double accumulators, no BLAS,
// single thread): the yardstick for tests.
void MatmulForwardReference(float* out, const float* inp, const float* weight,
                            const float* bias, int N, int C, int OC);
void MatmulBackwardReference(float* dinp, float* dweight, float* dbias,
                             const float* dout, const float* inp,
                             const float* weight, int N, int C, int OC);

// Causal multi-head self-attention. inp is the qkv activation (B, T, 3C):
// per token [q | k | v], each split into NH heads of hs = C/NH channels.
// out (B, T, C) = softmax(q k^T / sqrt(hs), causal) v, heads concatenated.
// lse (B, NH, T) saves each softmax row's log-sum-exp; the backward pass
// recomputes the attention matrix from q, k and lse instead of storing the
// (B, NH, T, T) matrices llm.c keeps. Both passes work on blocks of query
// rows against all keys up to the block's end, as cblas_sgemm calls on
// per-thread scratch (the masked upper triangle is skipped per block).
// REQUIRES: C % NH == 0.
void AttentionForward(float* out, float* lse, const float* inp, int B, int T,
                      int C, int NH);
// dinp (B, T, 3C) += gradient of out w.r.t. qkv, given dout (B, T, C).
void AttentionBackward(float* dinp, const float* dout, const float* inp,
                       const float* lse, int B, int T, int C, int NH);

// GELU, tanh approximation (GPT-2, llm.c):
// 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))). out may alias inp.
// tanh is computed as 1 - 2 / (exp(2u) + 1) with a vectorised exp (about
// 2 ulp): within 2e-7 of the exact tanh.
void GeluForward(float* out, const float* inp, size_t n);
// dinp += gelu'(inp) * dout. dinp must not alias dout.
void GeluBackward(float* dinp, const float* inp, const float* dout, size_t n);

// out = inp1 + inp2 (out may alias either).
void ResidualForward(float* out, const float* inp1, const float* inp2,
                     size_t n);
// dinp1 += dout; dinp2 += dout.
void ResidualBackward(float* dinp1, float* dinp2, const float* dout, size_t n);

// Softmax over the first V of Vp columns of each of N rows, and, when targets
// is not null, losses[i] = -log(probs[i, targets[i]]). Columns V..Vp-1 are
// padding: ignored by the softmax, their probs are written as 0. probs may
// alias logits (in place). REQUIRES: 0 <= targets[i] < V.
void CrossEntropySoftmaxForward(float* probs, float* losses,
                                const float* logits, const int* targets, int N,
                                int V, int Vp);
// WRITES dlogits = dloss * (probs - onehot(targets)) for the first V columns
// and 0 for the padding, i.e. the gradient of dloss * sum_i losses[i].
// dlogits may alias probs (in place).
void CrossEntropySoftmaxBackward(float* dlogits, const float* probs,
                                 const int* targets, float dloss, int N, int V,
                                 int Vp);

}  // namespace dslaunch::worker
