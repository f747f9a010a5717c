// Times the host's share of one ZeRO step with the optimizer offloaded, as
// the GPU engine (worker/gpu/sharded_engine.cc, GpuShardedEngine) drives a
// ZeroState at one rank: ZeroGrad, the backward hooks that reduce each
// bucket, FinishGradients and Update (clipping, AdamW, the gathered
// parameters). The device's copies of each layer's gradients to the host
// are stood in for by an untimed memcpy. Built by bench/zero_host_step.sh
// (target zero_host_step_bench). Prints one line per phase:
//   <phase> <median_ms> <min_ms> <max_ms>
// Threads: OpenMP's (OMP_NUM_THREADS). Single-threaded driver.
#include <omp.h>  // omp_get_max_threads

#include <algorithm>  // std::sort
#include <chrono>
#include <cstdio>
#include <cstdlib>  // std::atoi
#include <cstring>  // std::memcpy
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "worker/comm.h"
#include "worker/cpu_adam.h"
#include "worker/param_layout.h"
#include "worker/zero_state.h"

namespace {

using dslaunch::worker::ZeroState;
using Clock = std::chrono::steady_clock;

double Ms(Clock::time_point from) {
  return std::chrono::duration<double, std::milli>(Clock::now() - from).count();
}

struct Options {
  int layers = 12, channels = 768, heads = 12, vocab = 50257, seq = 1024;
  int warmup = 1, steps = 5, micro = 1, stage = 2;
  float clip_scale = 0.5f;  // 1: clipping inactive
};

// Per phase, the milliseconds of each timed step.
using Times = std::map<std::string, std::vector<double>>;

// One rank's ZeroState over a model of `o`'s shape, and the gradients the
// device would hand each layer.
struct Rank {
  explicit Rank(const Options& o)
      : layout(dslaunch::worker::ModelConfig::Make(o.seq, o.vocab, o.layers,
                                                   o.heads, o.channels),
               dslaunch::worker::ParamOrder::kLayerMajor),
        comm(dslaunch::worker::MakeSingleRankComm()),
        zero(layout, o.stage, comm.get(), 500000000),
        hooks(zero.Hooks(ZeroState::GradWindows::kCopied)),
        grads(layout.num_params()) {
    zero.InitParams(1);
    for (size_t i = 0; i < grads.size(); ++i)
      grads[i] = 1e-3f * static_cast<float>(static_cast<int>(i % 2001) - 1000);
  }
  dslaunch::worker::ParamLayout layout;
  std::unique_ptr<dslaunch::worker::Comm> comm;
  ZeroState zero;
  dslaunch::worker::LayerHooks hooks;
  std::vector<float> grads;
};

// What GpuShardedEngine's backward does per layer: the hooks around the
// device's copy of its gradients (untimed; the engine hands each layer to
// after_backward one layer later, once its copy has landed).
double Backward(const Options& o, Rank& r) {
  double ms = 0;
  for (int l = o.layers; l >= -1; --l) {
    auto start = Clock::now();
    r.hooks.before_backward(l);
    ms += Ms(start);
    const dslaunch::worker::ParamRange range = r.layout.LayerRanges(l).at(0);
    std::memcpy(r.zero.LayerGrads(l), r.grads.data() + range.begin,
                range.size() * sizeof(float));
    start = Clock::now();
    r.hooks.after_backward(l);
    ms += Ms(start);
  }
  return ms;
}

void Step(const Options& o, Rank& r, int64_t step, Times* t) {
  auto start = Clock::now();
  r.zero.ZeroGrad();
  (*t)["zero_grad"].push_back(Ms(start));
  double reduce = 0;
  for (int m = 0; m < o.micro; ++m) reduce += Backward(o, r);
  (*t)["backward_hooks"].push_back(reduce);
  start = Clock::now();
  if (!r.zero.FinishGradients().ok()) std::abort();
  (*t)["finish_gradients"].push_back(Ms(start));
  dslaunch::worker::AdamParams adam;
  adam.step = step;
  start = Clock::now();
  if (!r.zero.Update(adam, o.clip_scale).ok()) std::abort();
  (*t)["update"].push_back(Ms(start));
  // Informational: the gather alone (Update ran it already).
  start = Clock::now();
  if (!r.zero.GatherParams().ok()) std::abort();
  (*t)["(gather_params alone)"].push_back(Ms(start));
}

void Print(const Times& times) {
  double total = 0;
  for (const auto& [phase, ms_in] : times) {
    std::vector<double> ms = ms_in;
    std::sort(ms.begin(), ms.end());
    const double median = ms[ms.size() / 2];
    if (phase[0] != '(') total += median;
    std::printf("%-22s %9.1f %9.1f %9.1f\n", phase.c_str(), median, ms.front(),
                ms.back());
  }
  std::printf("%-22s %9.1f\n", "total", total);
}

bool Parse(int argc, char** argv, Options* o) {
  int no_clip = 0;
  const std::map<std::string, int*> flags = {
      {"--layers", &o->layers}, {"--channels", &o->channels},
      {"--steps", &o->steps},   {"--warmup", &o->warmup},
      {"--micro", &o->micro},   {"--stage", &o->stage},
      {"--no_clip", &no_clip}};
  for (int i = 1; i + 1 < argc; i += 2) {
    const auto flag = flags.find(argv[i]);
    if (flag == flags.end()) return false;
    *flag->second = std::atoi(argv[i + 1]);
  }
  if (no_clip != 0) o->clip_scale = 1.0f;
  return argc % 2 == 1 && o->steps >= 1 && o->micro >= 1;
}

}  // namespace

// usage: zero_host_step_bench [--layers N] [--channels N] [--steps N]
//   [--warmup N] [--micro N] [--stage 2|3] [--no_clip 1]
int main(int argc, char** argv) {
  Options o;
  if (!Parse(argc, argv, &o)) {
    std::fprintf(stderr, "usage: see bench/zero_host_step.cc\n");
    return 2;
  }
  Rank rank(o);
  std::printf(
      "# %zu parameters, stage %d, 1 rank, %d micro-batch(es), "
      "%d threads, adam isa %s, clip scale %g\n",
      rank.layout.num_params(), o.stage, o.micro, omp_get_max_threads(),
      dslaunch::worker::AdamIsaName(dslaunch::worker::ActiveAdamIsa()),
      o.clip_scale);
  std::printf("%-22s %9s %9s %9s\n", "phase", "median_ms", "min_ms", "max_ms");
  Times warm, times;
  int64_t step = 1;
  for (int i = 0; i < o.warmup; ++i) Step(o, rank, step++, &warm);
  for (int i = 0; i < o.steps; ++i) Step(o, rank, step++, &times);
  Print(times);
  return 0;
}
