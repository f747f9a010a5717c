// Times worker/cpu_adam's AdamStep for bench/cpu_adam.sh, which compiles it
// together with worker/cpu_adam.cc and base/status.cc. For every size and
// every ISA this CPU has, one flat buffer each of params, grads, m and v (like
// a flattened optimizer partition), `warmup` untimed steps, then `steps` timed
// ones. Prints one line per size and ISA:
//   ours <isa> <n> <median_ms> <min_ms> <max_ms>
// Threads: OpenMP's (OMP_NUM_THREADS). Single-threaded driver.
#include <omp.h>  // omp_get_max_threads

#include <algorithm>  // std::sort
#include <chrono>
#include <cstdio>
#include <cstdlib>  // std::strtoull, std::atoi
#include <cstring>  // std::strcmp
#include <random>
#include <vector>

#include "worker/cpu_adam.h"

namespace {

using dslaunch::worker::AdamIsa;

struct Buffers {
  std::vector<float> p, g, m, v;
};

// Filled in parallel so every thread first-touches the pages it will update.
Buffers MakeBuffers(size_t n) {
  Buffers b{std::vector<float>(n), std::vector<float>(n), std::vector<float>(n),
            std::vector<float>(n)};
#pragma omp parallel
  {
    std::mt19937 rng(1234u + static_cast<unsigned>(omp_get_thread_num()));
    std::normal_distribution<float> normal(0.0f, 1.0f);
#pragma omp for schedule(static)
    for (size_t i = 0; i < n; ++i) {
      b.p[i] = normal(rng);
      b.g[i] = 1e-2f * normal(rng);
      b.m[i] = 0.0f;
      b.v[i] = 0.0f;
    }
  }
  return b;
}

double StepMs(AdamIsa isa, Buffers* b, int64_t step) {
  const dslaunch::worker::AdamParams hp{
      .lr = 1e-3, .weight_decay = 0.01, .step = step};
  const auto start = std::chrono::steady_clock::now();
  dslaunch::worker::AdamStepWithIsa(isa, b->p.data(), b->g.data(), b->m.data(),
                                    b->v.data(), b->p.size(), hp, true);
  const auto end = std::chrono::steady_clock::now();
  return std::chrono::duration<double, std::milli>(end - start).count();
}

void Bench(AdamIsa isa, Buffers* b, int warmup, int steps) {
  int64_t step = 1;
  for (int i = 0; i < warmup; ++i) StepMs(isa, b, step++);
  std::vector<double> ms;
  for (int i = 0; i < steps; ++i) ms.push_back(StepMs(isa, b, step++));
  std::sort(ms.begin(), ms.end());
  std::printf("ours %s %zu %.3f %.3f %.3f\n",
              dslaunch::worker::AdamIsaName(isa), b->p.size(),
              ms[ms.size() / 2], ms.front(), ms.back());
  std::fflush(stdout);
}

}  // namespace

// usage: cpu_adam_bench [--warmup N] [--steps N] SIZE...
int main(int argc, char** argv) {
  int warmup = 3;
  int steps = 10;
  std::vector<size_t> sizes;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--warmup") == 0 && i + 1 < argc) {
      warmup = std::atoi(argv[++i]);
    } else if (std::strcmp(argv[i], "--steps") == 0 && i + 1 < argc) {
      steps = std::atoi(argv[++i]);
    } else {
      sizes.push_back(std::strtoull(argv[i], nullptr, 10));
    }
  }
  if (sizes.empty() || steps < 1 || warmup < 0) {
    std::fprintf(stderr, "usage: %s [--warmup N] [--steps N] SIZE...\n",
                 argv[0]);
    return 2;
  }
  std::printf("# threads %d, active isa %s\n", omp_get_max_threads(),
              dslaunch::worker::AdamIsaName(dslaunch::worker::ActiveAdamIsa()));
  for (size_t n : sizes) {
    Buffers b = MakeBuffers(n);
    for (AdamIsa isa : {AdamIsa::kAvx512, AdamIsa::kAvx2, AdamIsa::kScalar}) {
      if (!dslaunch::worker::CpuSupportsAdamIsa(isa)) continue;
      Bench(isa, &b, warmup, steps);
    }
  }
  return 0;
}
