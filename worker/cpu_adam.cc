// No floating-point contraction in this file: GCC would otherwise fuse a
// multiply and an add into an FMA (even between intrinsics) in the AVX2 and
// AVX-512 kernels only, and they would round differently from the scalar one.
// Every fused multiply-add below is written out as one. The pragma holds to
// the end of the unit: worker/CMakeLists.txt keeps this file out of unity
// builds.
#if defined(__clang__)
#pragma clang fp contract(off)
#else
#pragma GCC optimize("fp-contract=off")
#endif

#include "worker/cpu_adam.h"

#include <immintrin.h>  // AVX2, FMA and AVX-512F intrinsics

#include <cmath>    // std::fma, std::pow, std::sqrt
#include <cstdio>   // std::fprintf
#include <cstdlib>  // std::abort, std::getenv
#include <cstring>  // std::strcmp
#include <string>

#include "worker/parallel.h"  // ParallelRanges

namespace dslaunch::worker {
namespace {

// The per-step constants, each rounded once from double to fp32 (PyTorch
// passes Python floats to fp32 kernels the same way).
struct StepConstants {
  float grad_scale;  // gradients multiplied by it first
  float decay;       // AdamW: 1 - lr*wd, or 1 when this range does not decay
  float l2;          // Adam-L2: wd (used only by the kL2 kernels)
  float beta1;
  float one_minus_beta1;
  float beta2;
  float one_minus_beta2;
  float bc2_sqrt;  // sqrt(1 - beta2^step)
  float eps;
  float neg_step_size;  // -lr / (1 - beta1^step)
};

StepConstants MakeConstants(const AdamParams& p, bool apply_decay) {
  const double t = static_cast<double>(p.step);
  const double bc1 = 1.0 - std::pow(p.beta1, t);
  const double bc2 = 1.0 - std::pow(p.beta2, t);
  StepConstants c;
  c.grad_scale = p.grad_scale;
  const bool decoupled = p.adamw_mode && apply_decay;
  c.decay = decoupled ? static_cast<float>(1.0 - p.lr * p.weight_decay) : 1.0f;
  c.l2 = static_cast<float>(p.weight_decay);
  c.beta1 = static_cast<float>(p.beta1);
  c.one_minus_beta1 = static_cast<float>(1.0 - p.beta1);
  c.beta2 = static_cast<float>(p.beta2);
  c.one_minus_beta2 = static_cast<float>(1.0 - p.beta2);
  c.bc2_sqrt = static_cast<float>(std::sqrt(bc2));
  c.eps = static_cast<float>(p.eps);
  c.neg_step_size = static_cast<float>(-(p.lr / bc1));
  return c;
}

// torch.optim.Adam adds wd*p to the gradient only when wd != 0.
bool UsesL2(const AdamParams& p, bool apply_decay) {
  return !p.adamw_mode && apply_decay && p.weight_decay != 0.0;
}

using Kernel = void (*)(const StepConstants&, float*, const float*, float*,
                        float*, size_t);

// ---- Scalar reference ----

template <bool kL2>
void ScalarKernel(const StepConstants& c, float* p, const float* g, float* m,
                  float* v, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    float param = p[i];
    float grad = g[i] * c.grad_scale;
    if constexpr (kL2) {
      grad = std::fma(param, c.l2, grad);
    } else {
      param = param * c.decay;
    }
    const float mi = std::fma(grad, c.one_minus_beta1, m[i] * c.beta1);
    const float vi = std::fma(c.one_minus_beta2 * grad, grad, v[i] * c.beta2);
    const float denom = std::sqrt(vi) / c.bc2_sqrt + c.eps;
    p[i] = param + (c.neg_step_size * mi) / denom;
    m[i] = mi;
    v[i] = vi;
  }
}

// ---- AVX2 + FMA ----

#define DSL_AVX2 __attribute__((target("avx2,fma")))

struct Avx2Constants {
  __m256 decay, l2, beta1, one_minus_beta1, beta2, one_minus_beta2;
  __m256 bc2_sqrt, eps, neg_step_size, grad_scale;
};

DSL_AVX2 Avx2Constants Broadcast256(const StepConstants& c) {
  return {_mm256_set1_ps(c.decay),         _mm256_set1_ps(c.l2),
          _mm256_set1_ps(c.beta1),         _mm256_set1_ps(c.one_minus_beta1),
          _mm256_set1_ps(c.beta2),         _mm256_set1_ps(c.one_minus_beta2),
          _mm256_set1_ps(c.bc2_sqrt),      _mm256_set1_ps(c.eps),
          _mm256_set1_ps(c.neg_step_size), _mm256_set1_ps(c.grad_scale)};
}

// One vector of ScalarKernel's loop body, operation for operation.
template <bool kL2>
DSL_AVX2 inline void Avx2Update(const Avx2Constants& k, __m256* p, __m256 g,
                                __m256* m, __m256* v) {
  g = _mm256_mul_ps(g, k.grad_scale);
  if constexpr (kL2) {
    g = _mm256_fmadd_ps(*p, k.l2, g);
  } else {
    *p = _mm256_mul_ps(*p, k.decay);
  }
  *m = _mm256_fmadd_ps(g, k.one_minus_beta1, _mm256_mul_ps(*m, k.beta1));
  *v = _mm256_fmadd_ps(_mm256_mul_ps(k.one_minus_beta2, g), g,
                       _mm256_mul_ps(*v, k.beta2));
  const __m256 denom =
      _mm256_add_ps(_mm256_div_ps(_mm256_sqrt_ps(*v), k.bc2_sqrt), k.eps);
  *p = _mm256_add_ps(*p,
                     _mm256_div_ps(_mm256_mul_ps(k.neg_step_size, *m), denom));
}

template <bool kL2>
DSL_AVX2 void Avx2Kernel(const StepConstants& c, float* p, const float* g,
                         float* m, float* v, size_t n) {
  const Avx2Constants k = Broadcast256(c);
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    __m256 pv = _mm256_loadu_ps(p + i);
    __m256 mv = _mm256_loadu_ps(m + i);
    __m256 vv = _mm256_loadu_ps(v + i);
    Avx2Update<kL2>(k, &pv, _mm256_loadu_ps(g + i), &mv, &vv);
    _mm256_storeu_ps(p + i, pv);
    _mm256_storeu_ps(m + i, mv);
    _mm256_storeu_ps(v + i, vv);
  }
  if (i == n) return;
  // The last 1-7 elements: masked loads (lanes past n read as 0, no fault)
  // and masked stores, through the same arithmetic.
  const __m256i mask =
      _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(n - i)),
                         _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
  __m256 pv = _mm256_maskload_ps(p + i, mask);
  __m256 mv = _mm256_maskload_ps(m + i, mask);
  __m256 vv = _mm256_maskload_ps(v + i, mask);
  Avx2Update<kL2>(k, &pv, _mm256_maskload_ps(g + i, mask), &mv, &vv);
  _mm256_maskstore_ps(p + i, mask, pv);
  _mm256_maskstore_ps(m + i, mask, mv);
  _mm256_maskstore_ps(v + i, mask, vv);
}

// ---- AVX-512F ----

#define DSL_AVX512 __attribute__((target("avx512f")))

struct Avx512Constants {
  __m512 decay, l2, beta1, one_minus_beta1, beta2, one_minus_beta2;
  __m512 bc2_sqrt, eps, neg_step_size, grad_scale;
};

DSL_AVX512 Avx512Constants Broadcast512(const StepConstants& c) {
  return {_mm512_set1_ps(c.decay),         _mm512_set1_ps(c.l2),
          _mm512_set1_ps(c.beta1),         _mm512_set1_ps(c.one_minus_beta1),
          _mm512_set1_ps(c.beta2),         _mm512_set1_ps(c.one_minus_beta2),
          _mm512_set1_ps(c.bc2_sqrt),      _mm512_set1_ps(c.eps),
          _mm512_set1_ps(c.neg_step_size), _mm512_set1_ps(c.grad_scale)};
}

// GCC 12 reports its own _mm512_sqrt_ps (an `__m512 __Y = __Y;` placeholder
// for the unused merge source) as maybe-uninitialized where it is inlined: a
// false positive.
#pragma GCC diagnostic push
#if !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
template <bool kL2>
DSL_AVX512 inline void Avx512Update(const Avx512Constants& k, __m512* p,
                                    __m512 g, __m512* m, __m512* v) {
  g = _mm512_mul_ps(g, k.grad_scale);
  if constexpr (kL2) {
    g = _mm512_fmadd_ps(*p, k.l2, g);
  } else {
    *p = _mm512_mul_ps(*p, k.decay);
  }
  *m = _mm512_fmadd_ps(g, k.one_minus_beta1, _mm512_mul_ps(*m, k.beta1));
  *v = _mm512_fmadd_ps(_mm512_mul_ps(k.one_minus_beta2, g), g,
                       _mm512_mul_ps(*v, k.beta2));
  const __m512 denom =
      _mm512_add_ps(_mm512_div_ps(_mm512_sqrt_ps(*v), k.bc2_sqrt), k.eps);
  *p = _mm512_add_ps(*p,
                     _mm512_div_ps(_mm512_mul_ps(k.neg_step_size, *m), denom));
}

template <bool kL2>
DSL_AVX512 void Avx512Kernel(const StepConstants& c, float* p, const float* g,
                             float* m, float* v, size_t n) {
  const Avx512Constants k = Broadcast512(c);
  size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    __m512 pv = _mm512_loadu_ps(p + i);
    __m512 mv = _mm512_loadu_ps(m + i);
    __m512 vv = _mm512_loadu_ps(v + i);
    Avx512Update<kL2>(k, &pv, _mm512_loadu_ps(g + i), &mv, &vv);
    _mm512_storeu_ps(p + i, pv);
    _mm512_storeu_ps(m + i, mv);
    _mm512_storeu_ps(v + i, vv);
  }
  if (i == n) return;
  const __mmask16 mask = static_cast<__mmask16>((1u << (n - i)) - 1);
  __m512 pv = _mm512_maskz_loadu_ps(mask, p + i);
  __m512 mv = _mm512_maskz_loadu_ps(mask, m + i);
  __m512 vv = _mm512_maskz_loadu_ps(mask, v + i);
  Avx512Update<kL2>(k, &pv, _mm512_maskz_loadu_ps(mask, g + i), &mv, &vv);
  _mm512_mask_storeu_ps(p + i, mask, pv);
  _mm512_mask_storeu_ps(m + i, mask, mv);
  _mm512_mask_storeu_ps(v + i, mask, vv);
}
#pragma GCC diagnostic pop

// ---- Dispatch ----

Kernel PickKernel(AdamIsa isa, bool l2) {
  switch (isa) {
    case AdamIsa::kAvx2:
      return l2 ? Avx2Kernel<true> : Avx2Kernel<false>;
    case AdamIsa::kAvx512:
      return l2 ? Avx512Kernel<true> : Avx512Kernel<false>;
    case AdamIsa::kScalar:
      break;
  }
  return l2 ? ScalarKernel<true> : ScalarKernel<false>;
}

AdamIsa WidestSupportedIsa() {
  if (CpuSupportsAdamIsa(AdamIsa::kAvx512)) return AdamIsa::kAvx512;
  if (CpuSupportsAdamIsa(AdamIsa::kAvx2)) return AdamIsa::kAvx2;
  return AdamIsa::kScalar;
}

}  // namespace

const char* AdamIsaName(AdamIsa isa) {
  switch (isa) {
    case AdamIsa::kAvx2:
      return "avx2";
    case AdamIsa::kAvx512:
      return "avx512";
    case AdamIsa::kScalar:
      break;
  }
  return "scalar";
}

bool CpuSupportsAdamIsa(AdamIsa isa) {
  __builtin_cpu_init();
  switch (isa) {
    case AdamIsa::kAvx2:
      return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    case AdamIsa::kAvx512:
      return __builtin_cpu_supports("avx512f");
    case AdamIsa::kScalar:
      break;
  }
  return true;
}

StatusOr<AdamIsa> ResolveAdamIsa(const char* forced) {
  if (forced == nullptr || *forced == '\0') return WidestSupportedIsa();
  for (AdamIsa isa : {AdamIsa::kScalar, AdamIsa::kAvx2, AdamIsa::kAvx512}) {
    if (std::strcmp(forced, AdamIsaName(isa)) != 0) continue;
    if (!CpuSupportsAdamIsa(isa)) {
      return InvalidArgument(std::string("DSL_CPU_ADAM_ISA=") + forced +
                             ": this CPU does not support it");
    }
    return isa;
  }
  return InvalidArgument(std::string("DSL_CPU_ADAM_ISA=") + forced +
                         ": expected scalar, avx2 or avx512");
}

AdamIsa ActiveAdamIsa() {
  static const AdamIsa isa = [] {
    StatusOr<AdamIsa> resolved =
        ResolveAdamIsa(std::getenv("DSL_CPU_ADAM_ISA"));
    if (!resolved.ok()) {
      std::fprintf(stderr, "%s\n", resolved.status().message().c_str());
      std::abort();
    }
    return *resolved;
  }();
  return isa;
}

void AdamStepWithIsa(AdamIsa isa, float* params, const float* grads, float* m,
                     float* v, size_t n, const AdamParams& p,
                     bool apply_decay) {
  DSL_CHECK(p.step >= 1);
  DSL_CHECK(CpuSupportsAdamIsa(isa));
  if (n == 0) return;
  const Kernel kernel = PickKernel(isa, UsesL2(p, apply_decay));
  const StepConstants c = MakeConstants(p, apply_decay);
  // Every element is computed alone: the split does not change a bit.
  ParallelRanges(n, [&](size_t b, size_t e) {
    kernel(c, params + b, grads + b, m + b, v + b, e - b);
  });
}

void AdamStep(float* params, const float* grads, float* m, float* v, size_t n,
              const AdamParams& p, bool apply_decay) {
  AdamStepWithIsa(ActiveAdamIsa(), params, grads, m, v, n, p, apply_decay);
}

}  // namespace dslaunch::worker
