// Profile: with DSL_CUDA_PROFILE=1, the CUDA engine's GPU time per part of
// a training step (worker/cuda/cuda_engine.cu marks the parts).
#pragma once

#include <cuda_runtime.h>

#include <cstdio>
#include <utility>
#include <vector>

namespace dslaunch::worker::cuda {

// With DSL_CUDA_PROFILE=1: GPU time per part of the step, from events
// recorded between the parts (the events cost a few microseconds each, so
// only when asked), printed to stderr when the engine ends.
class Profile {
 public:
  enum Part {
    kEmbedding,
    kLayerNorm,
    kMatmul,
    kAttention,
    kPointwise,
    kHead,
    kClassifier,
    kOptimizer,
    kHost,         // the host's layer hooks (ZeRO 2/3): copies and collectives
    kCollectives,  // NCCL
    kParts
  };
  explicit Profile(bool on) : on_(on) {}
  ~Profile() {
    for (auto& m : marks_) cudaEventDestroy(m.first);
    for (cudaEvent_t e : spare_) cudaEventDestroy(e);
  }
  // From here until the next Mark, the stream's work counts for `part`.
  void Mark(cudaStream_t stream, Part part) {
    if (!on_) return;
    cudaEvent_t e;
    if (spare_.empty()) {
      cudaEventCreate(&e);
    } else {
      e = spare_.back();
      spare_.pop_back();
    }
    cudaEventRecord(e, stream);
    marks_.emplace_back(e, part);
  }
  // After a stream synchronisation: adds up the finished intervals.
  void Collect() {
    if (!on_ || marks_.size() < 2) return;
    for (size_t i = 0; i + 1 < marks_.size(); i++) {
      float ms = 0;
      if (cudaEventElapsedTime(&ms, marks_[i].first, marks_[i + 1].first) ==
          cudaSuccess)
        ms_[marks_[i].second] += ms;
      spare_.push_back(marks_[i].first);
    }
    marks_.erase(marks_.begin(), marks_.end() - 1);
  }
  void StepDone() { steps_++; }
  void Print() const {
    if (!on_ || steps_ == 0) return;
    static const char* names[kParts] = {
        "embedding", "layernorm",  "matmul",    "attention",  "pointwise",
        "lm head",   "classifier", "optimizer", "host hooks", "nccl"};
    double total = 0;
    for (double x : ms_) total += x;
    std::fprintf(stderr,
                 "dsworker: GPU time per step over %lld steps: %.2f ms\n",
                 steps_, total / steps_);
    for (int p = 0; p < kParts; p++) {
      std::fprintf(stderr, "  %-11s %9.2f ms  %5.1f%%\n", names[p],
                   ms_[p] / steps_, total > 0 ? 100 * ms_[p] / total : 0.0);
    }
  }

 private:
  bool on_;
  std::vector<std::pair<cudaEvent_t, Part>> marks_;
  std::vector<cudaEvent_t> spare_;
  double ms_[kParts] = {};
  long long steps_ = 0;
};

}  // namespace dslaunch::worker::cuda
