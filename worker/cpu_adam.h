// CPU optimizer step: AdamW (decoupled weight decay) and Adam with L2, on
// fp32 buffers, vectorised (scalar, AVX2+FMA, AVX-512, chosen at run time)
// and parallel over OpenMP threads. Used by the CPU engine and by the GPU
// engine's optimizer offload. Stateless: the caller owns params, grads and the
// moments m and v. Callable from any thread, one call per buffer at a time;
// each call opens its own OpenMP parallel region.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>

#include "base/status.h"

namespace dslaunch::worker {

// Hyperparameters of one step. Doubles, as Python floats are in PyTorch: the
// per-step constants (1 - lr*wd, lr/bc1, sqrt(bc2), 1 - beta) are computed in
// double and rounded to fp32 once, exactly as torch.optim.AdamW does.
// Defaults are torch.optim.AdamW's.
struct AdamParams {
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 1e-2;
  // true: AdamW, p *= 1 - lr*wd before the update (torch.optim.AdamW).
  // false: Adam with L2, g += wd*p (torch.optim.Adam; DeepSpeed's
  // adamw_mode=False).
  bool adamw_mode = true;
  int64_t step = 1;  // number of this step, 1-based (bias corrections)
  // Gradients are multiplied by this first (gradient clipping's scale),
  // in registers: the gradient buffer is left as it was. x * 1 is x, so 1
  // changes nothing; any other value gives the bits of scaling the buffer
  // in place beforehand.
  float grad_scale = 1.0f;
};

// What an optimizer step over a parameter buffer calls with each range
// [begin, begin + count) of it that is final for the step, in order, while
// it goes on with the rest (so that a device can copy one range while the
// host updates the next); an error stops the step.
using ParamsUpdated = std::function<Status(size_t begin, size_t count)>;

// Updates n elements in place, per element exactly as PyTorch 1.13's
// single-tensor AdamW/Adam on an AVX2 CPU computes it (fp32, with FMA where
// its kernels fuse):
//   AdamW: p = p * f(1 - lr*wd)         Adam-L2: g = fma(p, f(wd), g)
//   m = fma(g, f(1-b1), m * f(b1))
//   v = fma(f(1-b2) * g, g, v * f(b2))
//   denom = sqrt(v) / f(sqrt(1 - b2^t)) + f(eps)
//   p = p + (f(-lr / (1 - b1^t)) * m) / denom
// where f() rounds a double to fp32. Every ISA and thread count gives
// bit-identical results (same operations, each correctly rounded; this file
// is compiled without FP contraction).
// apply_decay false skips the weight decay for this range (biases, norms):
// callers split their parameters into ranges by decay flag.
// REQUIRES: the four buffers do not overlap; p.step >= 1.
void AdamStep(float* params, const float* grads, float* m, float* v, size_t n,
              const AdamParams& p, bool apply_decay);

// Instruction sets with an implementation.
enum class AdamIsa { kScalar, kAvx2, kAvx512 };

const char* AdamIsaName(AdamIsa isa);  // "scalar", "avx2", "avx512"
// kAvx2 needs AVX2 and FMA; kAvx512 needs AVX-512F (and OS support).
bool CpuSupportsAdamIsa(AdamIsa isa);

// The ISA for a value of DSL_CPU_ADAM_ISA: null or empty picks the widest one
// this CPU supports; "scalar", "avx2" or "avx512" forces one. Unknown names
// and ISAs this CPU lacks are errors.
StatusOr<AdamIsa> ResolveAdamIsa(const char* forced);

// The ISA AdamStep uses: ResolveAdamIsa(getenv("DSL_CPU_ADAM_ISA")), read
// once on first use. Aborts with a message if the variable is invalid.
AdamIsa ActiveAdamIsa();

// AdamStep with a given ISA (tests, benchmarks).
// REQUIRES: CpuSupportsAdamIsa(isa).
void AdamStepWithIsa(AdamIsa isa, float* params, const float* grads, float* m,
                     float* v, size_t n, const AdamParams& p, bool apply_decay);

}  // namespace dslaunch::worker
