// cuBLASLt for the products that add a bias (kernels_cuda.h's
// MatmulForward): the bias goes in through the product's epilogue instead
// of being written into the output first and read back (beta 1), which
// was 3.3 ms of a 73 ms GPT-2 step on an H200. The algorithm cuBLASLt's
// heuristic picks is kept for each shape, so a step asks once per shape.
#include <cublasLt.h>

#include <array>
#include <map>
#include <mutex>

#include "worker/cuda/kernels_cuda.h"

namespace dslaunch::worker::cuda {

// One per engine, whose products all run on its one stream: the workspace
// is used by one product at a time.
struct LtState {
  cublasLtHandle_t handle = nullptr;
  void* workspace = nullptr;
  size_t workspace_bytes = 0;
  // The algorithm for each shape and alignment; false: none, or it failed,
  // take the other path.
  std::map<std::array<long long, 14>, std::pair<bool, cublasLtMatmulAlgo_t>>
      algos;
  std::mutex mu;
};

namespace {

constexpr size_t kWorkspaceBytes = size_t{32} << 20;  // Hopper's suggestion

// Descriptors of one product, freed on every way out.
struct LtDescs {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
  ~LtDescs() {
    if (c != nullptr) cublasLtMatrixLayoutDestroy(c);
    if (b != nullptr) cublasLtMatrixLayoutDestroy(b);
    if (a != nullptr) cublasLtMatrixLayoutDestroy(a);
    if (op != nullptr) cublasLtMatmulDescDestroy(op);
  }
};

bool Ok(cublasStatus_t s) { return s == CUBLAS_STATUS_SUCCESS; }

// The largest power of 2 up to 256 dividing p's address. cuBLASLt's
// heuristic never sees the pointers: it assumes 256-byte operands unless
// told less, and the algorithm it picks may fail or fault on less.
uint32_t Alignment(const void* p) {
  const auto a = reinterpret_cast<uintptr_t>(p);
  uint32_t n = 256;
  while (n > 1 && a % n != 0) n /= 2;
  return n;
}

}  // namespace

LtState* LtCreate() {
  auto* lt = new LtState;
  if (!Ok(cublasLtCreate(&lt->handle)) ||
      cudaMalloc(&lt->workspace, kWorkspaceBytes) != cudaSuccess) {
    cudaGetLastError();  // a failed allocation is not the stream's error
    LtDestroy(lt);
    return nullptr;
  }
  lt->workspace_bytes = kWorkspaceBytes;
  return lt;
}

void LtDestroy(LtState* lt) {
  if (lt == nullptr) return;
  if (lt->workspace != nullptr) cudaFree(lt->workspace);
  if (lt->handle != nullptr) cublasLtDestroy(lt->handle);
  delete lt;
}

int LtShapesTaken(LtState* lt) {
  if (lt == nullptr) return 0;
  std::lock_guard<std::mutex> lock(lt->mu);
  int n = 0;
  for (const auto& [key, algo] : lt->algos) n += algo.first ? 1 : 0;
  return n;
}

bool LtGemmBias(const Ctx& ctx, bool trans_a, bool trans_b, int M, int N, int K,
                const void* A, int lda, const void* B, int ldb,
                cudaDataType_t type, cublasComputeType_t compute,
                const float* bias, float* C, int ldc) {
  LtState* lt = ctx.lt;
  if (lt == nullptr || bias == nullptr) return false;
  // cuBLASLt's A is our B, its B our A. The bias has no alignment
  // preference (the heuristic reads it from the pointer it was asked
  // with): below 16 bytes the other path.
  const uint32_t align_a = Alignment(B), align_b = Alignment(A),
                 align_c = Alignment(C), align_bias = Alignment(bias);
  if (align_bias < 16) return false;
  // Row-major C = op(A) op(B) is column-major C^T = op(B)^T op(A)^T: in
  // cuBLASLt's terms A is our B (m = N rows of the result) and B our A,
  // and the bias, one entry per row of C^T, is one per column of C.
  const cublasOperation_t op_a = trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t op_b = trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  LtDescs d;
  const cudaDataType_t scale = CUDA_R_32F, out = CUDA_R_32F;
  const cublasLtEpilogue_t epilogue = CUBLASLT_EPILOGUE_BIAS;
  const int32_t bias_type = CUDA_R_32F;
  if (!Ok(cublasLtMatmulDescCreate(&d.op, compute, scale)) ||
      !Ok(cublasLtMatmulDescSetAttribute(d.op, CUBLASLT_MATMUL_DESC_TRANSA,
                                         &op_a, sizeof op_a)) ||
      !Ok(cublasLtMatmulDescSetAttribute(d.op, CUBLASLT_MATMUL_DESC_TRANSB,
                                         &op_b, sizeof op_b)) ||
      !Ok(cublasLtMatmulDescSetAttribute(d.op, CUBLASLT_MATMUL_DESC_EPILOGUE,
                                         &epilogue, sizeof epilogue)) ||
      !Ok(cublasLtMatmulDescSetAttribute(
          d.op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof bias)) ||
      !Ok(cublasLtMatmulDescSetAttribute(d.op,
                                         CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE,
                                         &bias_type, sizeof bias_type)) ||
      // As stored, column-major: rows x columns, leading dimension.
      !Ok(cublasLtMatrixLayoutCreate(&d.a, type, trans_b ? K : N,
                                     trans_b ? N : K, ldb)) ||
      !Ok(cublasLtMatrixLayoutCreate(&d.b, type, trans_a ? M : K,
                                     trans_a ? K : M, lda)) ||
      !Ok(cublasLtMatrixLayoutCreate(&d.c, out, N, M, ldc))) {
    return false;
  }
  const std::array<long long, 14> key = {
      trans_a, trans_b, M,       N,       K,       lda,     ldb,
      ldc,     type,    compute, align_a, align_b, align_c, align_bias};
  std::pair<bool, cublasLtMatmulAlgo_t> algo{};
  {
    std::lock_guard<std::mutex> lock(lt->mu);
    auto it = lt->algos.find(key);
    if (it != lt->algos.end()) {
      algo = it->second;
    } else {
      cublasLtMatmulPreference_t pref = nullptr;
      cublasLtMatmulHeuristicResult_t result{};
      int found = 0;
      const uint64_t ws = lt->workspace_bytes;
      if (Ok(cublasLtMatmulPreferenceCreate(&pref)) &&
          Ok(cublasLtMatmulPreferenceSetAttribute(
              pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws,
              sizeof ws)) &&
          Ok(cublasLtMatmulPreferenceSetAttribute(
              pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &align_a,
              sizeof align_a)) &&
          Ok(cublasLtMatmulPreferenceSetAttribute(
              pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &align_b,
              sizeof align_b)) &&
          Ok(cublasLtMatmulPreferenceSetAttribute(
              pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &align_c,
              sizeof align_c)) &&
          Ok(cublasLtMatmulPreferenceSetAttribute(
              pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &align_c,
              sizeof align_c)) &&
          Ok(cublasLtMatmulAlgoGetHeuristic(lt->handle, d.op, d.a, d.b, d.c,
                                            d.c, pref, 1, &result, &found)) &&
          found > 0) {
        algo = {true, result.algo};
      }
      if (pref != nullptr) cublasLtMatmulPreferenceDestroy(pref);
      lt->algos[key] = algo;
    }
  }
  if (!algo.first) return false;
  const float alpha = 1.0f, beta = 0.0f;
  if (Ok(cublasLtMatmul(lt->handle, d.op, &alpha, B, d.a, A, d.b, &beta, C, d.c,
                        C, d.c, &algo.second, lt->workspace,
                        lt->workspace_bytes, ctx.stream)))
    return true;
  std::lock_guard<std::mutex> lock(lt->mu);  // not again for this shape
  lt->algos[key].first = false;
  return false;
}

}  // namespace dslaunch::worker::cuda
