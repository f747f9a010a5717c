// The linear layers' matrix products (cuBLAS, and cuBLASLt where the bias
// goes in the epilogue: lt_gemm.cc) on the operands each precision takes;
// declared in kernels_cuda.h.
#include "worker/cuda/kernels_cuda.h"
#include "worker/cuda/launch.cuh"

namespace dslaunch::worker::cuda {
namespace {

using namespace launch;  // NOLINT: kThreads, Blocks

__global__ void BiasRowsKernel(float* out, const float* bias, int N, int OC) {
  const size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x;
  if (i >= static_cast<size_t>(N) * OC) return;
  out[i] = bias != nullptr ? bias[i % OC] : 0.0f;
}

// Elements of an operand as stored whose op is rows x cols: `rows` rows of
// ld (cols rows when transposed).
size_t OperandElems(bool trans, int rows, int cols, int ld) {
  return static_cast<size_t>(trans ? cols : rows) * ld;
}

}  // namespace

cublasStatus_t RowGemm(const Ctx& ctx, bool trans_a, bool trans_b, int M, int N,
                       int K, float alpha, Operand A, int lda, Operand B,
                       int ldb, float beta, float* C, int ldc) {
  // Row-major C = op(A) op(B) is column-major C^T = op(B)^T op(A)^T.
  const cublasOperation_t op_a = trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t op_b = trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  if (ctx.operands == CUDA_R_32F) {
    if (A.fp32 == nullptr || B.fp32 == nullptr)
      return CUBLAS_STATUS_INVALID_VALUE;
    return cublasGemmEx(ctx.blas, op_b, op_a, N, M, K, &alpha, B.fp32,
                        CUDA_R_32F, ldb, A.fp32, CUDA_R_32F, lda, &beta, C,
                        CUDA_R_32F, ldc, ctx.compute, CUBLAS_GEMM_DEFAULT);
  }
  // Every check before any rounding, so that a refusal changes nothing.
  const size_t a_elems = OperandElems(trans_a, M, K, lda);
  const size_t b_elems = OperandElems(trans_b, K, N, ldb);
  const bool round_a = A.rounded == nullptr, round_b = B.rounded == nullptr;
  if ((round_a && (A.fp32 == nullptr || a_elems > ctx.operand_a_elems)) ||
      (round_b && (B.fp32 == nullptr || b_elems > ctx.operand_b_elems)) ||
      (round_a && B.rounded == ctx.operand_a) ||
      (round_b && A.rounded == ctx.operand_b))
    return CUBLAS_STATUS_INVALID_VALUE;
  if (round_a) To16Bit(ctx, ctx.operands, ctx.operand_a, A.fp32, a_elems);
  if (round_b) To16Bit(ctx, ctx.operands, ctx.operand_b, B.fp32, b_elems);
  return cublasGemmEx(ctx.blas, op_b, op_a, N, M, K, &alpha,
                      round_b ? ctx.operand_b : B.rounded, ctx.operands, ldb,
                      round_a ? ctx.operand_a : A.rounded, ctx.operands, lda,
                      &beta, C, CUDA_R_32F, ldc, CUBLAS_COMPUTE_32F,
                      CUBLAS_GEMM_DEFAULT);
}

namespace {

// out = inp @ weight^T + bias by cuBLAS alone: the bias rows written first
// and the product added to them, or the product alone.
cublasStatus_t ProductOverBias(const Ctx& ctx, float* out, Operand inp,
                               Operand weight, const float* bias, int N, int C,
                               int OC) {
  if (bias != nullptr) {
    BiasRowsKernel<<<Blocks(static_cast<size_t>(N) * OC), kThreads, 0,
                     ctx.stream>>>(out, bias, N, OC);
  }
  return RowGemm(ctx, false, true, N, OC, C, 1.0f, inp, C, weight, C,
                 bias != nullptr ? 1.0f : 0.0f, out, OC);
}

// The same on 16-bit operands, rounded here unless they come so, with the
// bias in cuBLASLt's epilogue where it takes the shape.
cublasStatus_t RoundedProductWithBias(const Ctx& ctx, float* out, Operand inp,
                                      const float* weight, const float* bias,
                                      int N, int C, int OC) {
  const size_t a = static_cast<size_t>(N) * C, b = static_cast<size_t>(OC) * C;
  if ((inp.rounded == nullptr &&
       (inp.fp32 == nullptr || a > ctx.operand_a_elems)) ||
      inp.rounded == ctx.operand_b || b > ctx.operand_b_elems)
    return CUBLAS_STATUS_INVALID_VALUE;
  if (inp.rounded == nullptr) {
    To16Bit(ctx, ctx.operands, ctx.operand_a, inp.fp32, a);
    inp = Operand::Rounded(ctx.operand_a);
  }
  To16Bit(ctx, ctx.operands, ctx.operand_b, weight, b);
  if (LtGemmBias(ctx, false, true, N, OC, C, inp.rounded, C, ctx.operand_b, C,
                 ctx.operands, CUBLAS_COMPUTE_32F, bias, out, OC))
    return CUBLAS_STATUS_SUCCESS;
  // A shape cuBLASLt takes no algorithm for, on the operands as rounded.
  return ProductOverBias(ctx, out, inp, Operand::Rounded(ctx.operand_b), bias,
                         N, C, OC);
}

}  // namespace

cublasStatus_t MatmulForward(const Ctx& ctx, float* out, Operand inp,
                             const float* weight, const float* bias, int N,
                             int C, int OC, void* out_bf16) {
  const bool fp32 = ctx.operands == CUDA_R_32F;
  if (fp32 && inp.fp32 == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
  const bool lt = bias != nullptr && ctx.lt != nullptr;
  cublasStatus_t st;
  if (lt && !fp32) {
    st = RoundedProductWithBias(ctx, out, inp, weight, bias, N, C, OC);
  } else if (lt && LtGemmBias(ctx, false, true, N, OC, C, inp.fp32, C, weight,
                              C, CUDA_R_32F, ctx.compute, bias, out, OC)) {
    st = CUBLAS_STATUS_SUCCESS;
  } else {
    st = ProductOverBias(ctx, out, inp, weight, bias, N, C, OC);
  }
  if (st == CUBLAS_STATUS_SUCCESS && out_bf16 != nullptr)
    To16Bit(ctx, CUDA_R_16BF, out_bf16, out, static_cast<size_t>(N) * OC);
  return st;
}

cublasStatus_t MatmulBackward(const Ctx& ctx, float* dinp, float* dweight,
                              float* dbias, Operand dout, Operand inp,
                              const float* weight, int N, int C, int OC,
                              float* scratch, float dinp_beta) {
  // A rounded dout comes with its bias sums done (they need the fp32).
  if (dout.rounded != nullptr && dbias != nullptr)
    return CUBLAS_STATUS_INVALID_VALUE;
  if (ctx.operands != CUDA_R_32F) {
    // dout rounded once for both products (with the bias sums when there
    // is a bias: one read of dout), unless it comes so.
    // Every size first, so that a refusal changes nothing.
    const size_t nc = static_cast<size_t>(N) * C;
    if ((dout.rounded == nullptr &&
         (dout.fp32 == nullptr ||
          static_cast<size_t>(N) * OC > ctx.operand_a_elems)) ||
        (dinp != nullptr && dout.rounded == ctx.operand_b) ||
        static_cast<size_t>(OC) * C > ctx.operand_b_elems ||
        (inp.rounded == nullptr &&
         (inp.fp32 == nullptr || nc > ctx.operand_b_elems)) ||
        (inp.rounded != nullptr &&
         inp.rounded ==
             (dout.rounded != nullptr ? dout.rounded : ctx.operand_a)) ||
        (dinp != nullptr && inp.rounded == ctx.operand_b))
      return CUBLAS_STATUS_INVALID_VALUE;
    if (dout.rounded == nullptr && dbias != nullptr) {
      BiasGradient(ctx, dbias, dout.fp32, N, OC, scratch, ctx.operand_a);
    } else if (dout.rounded == nullptr) {
      To16Bit(ctx, ctx.operands, ctx.operand_a, dout.fp32,
              static_cast<size_t>(N) * OC);
    }
    const Operand rounded_dout =
        dout.rounded != nullptr ? dout : Operand::Rounded(ctx.operand_a);
    cublasStatus_t st = CUBLAS_STATUS_SUCCESS;
    if (dinp != nullptr) {
      st = RowGemm(ctx, false, false, N, C, OC, 1.0f, rounded_dout, OC, weight,
                   C, dinp_beta, dinp, C);
    }
    if (st != CUBLAS_STATUS_SUCCESS) return st;
    return RowGemm(ctx, true, false, OC, C, N, 1.0f, rounded_dout, OC, inp, C,
                   1.0f, dweight, C);
  }
  if (inp.fp32 == nullptr || dout.fp32 == nullptr)
    return CUBLAS_STATUS_INVALID_VALUE;
  if (dinp != nullptr) {
    const cublasStatus_t st = RowGemm(ctx, false, false, N, C, OC, 1.0f, dout,
                                      OC, weight, C, dinp_beta, dinp, C);
    if (st != CUBLAS_STATUS_SUCCESS) return st;
  }
  const cublasStatus_t st = RowGemm(ctx, true, false, OC, C, N, 1.0f, dout, OC,
                                    inp, C, 1.0f, dweight, C);
  if (st != CUBLAS_STATUS_SUCCESS) return st;
  if (dbias != nullptr) {
    BiasGradient(ctx, dbias, dout.fp32, N, OC, scratch, nullptr);
  }
  return CUBLAS_STATUS_SUCCESS;
}

}  // namespace dslaunch::worker::cuda
