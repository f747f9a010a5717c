// ReplicatedState: the optimizer side of ZeRO stages 0 and 1 over a Model's
// whole parameters and gradients in host memory. Every rank holds whole
// parameters and gradients (padded here so the gradients split evenly); the
// AdamW moments of this rank's part: everything under stage 0, its shard of
// the partition (worker/partition.h) under stage 1. Stage 0 all-reduces the
// gradients; stage 1 reduce-scatters them, updates its shard and all-gathers
// the parameters.
//
// The CPU engine for stages 0 and 1 is a Model with one of these; the GPU
// engine uses one for what passes through host memory when ranks reduce
// over Gloo or the optimizer is offloaded (worker/gpu/). Single-threaded;
// the passes over whole buffers run on the OpenMP team (flat_math.h).
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "base/status.h"
#include "worker/checkpoint.h"
#include "worker/comm.h"
#include "worker/cpu_adam.h"
#include "worker/model.h"

namespace dslaunch::worker {

class ReplicatedState {
 public:
  // REQUIRES: stage 0 or 1; model outlives this.
  ReplicatedState(Model* model, int stage, Comm* comm);

  // [shard_begin, shard_begin + shard_size): the part whose moments this
  // rank holds and updates (padding included: shard_real() are real).
  size_t shard_begin() const { return shard_begin_; }
  size_t shard_size() const { return shard_size_; }
  size_t shard_real() const;
  std::span<float> m() { return m_; }
  std::span<float> v() { return v_; }

  // Averages the gradients over ranks (stage 0: all of them; stage 1: this
  // rank's shard) and returns the global norm of what the ranks update.
  StatusOr<float> FinishGradients();
  // Step, then GatherParams.
  Status Update(const AdamParams& adam, float clip_scale);
  // AdamW on the shard, its gradients scaled by clip_scale (the buffer left
  // as it is); with `updated`, called with each range of the parameters
  // as it is done (pieces of at most kUpdatedFloats).
  Status Step(const AdamParams& adam, float clip_scale,
              const ParamsUpdated& updated = nullptr);
  static constexpr size_t kUpdatedFloats = size_t{1} << 22;  // 16 MiB
  // Stage 1: every rank's updated shard into every rank's parameters.
  Status GatherParams();

  // Parameters and moments of [begin, begin + count), which lies in this
  // rank's shard under stage 1; valid until the next call.
  RankShard CheckpointRange(size_t begin, size_t count) const;
  // Whole parameters and this rank's moments from a checkpoint.
  Status Resume(const std::string& dir);
  // The moments, in bytes.
  int64_t moment_bytes() const;

 private:
  Model* model_;
  int stage_;
  Comm* comm_;
  size_t shard_begin_ = 0, shard_size_ = 0;
  std::vector<float> m_, v_;
  std::vector<float> gather_in_;  // stage 1: own updated piece
};

}  // namespace dslaunch::worker
