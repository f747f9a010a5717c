// Sharded, atomic checkpoints. A checkpoint is a directory
// <root>/step_<NNNNNNNN>/ holding one file per rank (that rank's range of
// the flat parameters and of the AdamW moments), a manifest.json (step,
// world size, model, data position), and a COMPLETE marker written last, by
// rank 0, after every rank's file is durably in place; a directory without
// the marker is never taken. Loading reads whatever ranges the current world
// needs from the saved files, so a different world size reshards. Each
// function is called by every rank (they meet at barriers); single-threaded.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>

#include "worker/comm.h"
#include "worker/data_loader.h"
#include "worker/model.h"

namespace dslaunch::worker {

struct CheckpointState {
  int64_t step = 0;
  size_t num_params = 0;
  LoaderState loader;  // rank 0's; positions are global
  ModelConfig model;
  // The global batch it trained with (micro x accumulation x world); 0 in
  // checkpoints written before it was recorded. Read back only.
  int64_t train_batch_size = 0;
  int world_size = 0;  // the ranks that wrote it; read back only
};

// This rank's share of the state: elements [begin, begin + params.size()) of
// the flat parameter buffer and of the two moments (real elements only).
struct RankShard {
  size_t begin = 0;
  std::span<const float> params, m, v;
};

// Writes step_<step>/ under root (rank 0 makes it, group-writable where it
// makes it: ranks may run as different users of one group); then, on rank
// 0, removes complete
// checkpoints beyond the newest `keep` (0 = keep all) and stale incomplete
// ones. Returns the directory written.
StatusOr<std::string> SaveCheckpoint(const std::string& root,
                                     const CheckpointState& state,
                                     const RankShard& shard, int keep,
                                     Comm& comm);

// The newest complete checkpoint directory under root, or nullopt.
std::optional<std::string> LatestCheckpoint(const std::string& root);
StatusOr<CheckpointState> ReadCheckpointState(const std::string& dir);

// Fills elements [begin, begin + out.size()) of a saved buffer
// (which: "params", "m" or "v") from dir's rank files.
Status ReadCheckpointRange(const std::string& dir, const char* which,
                           size_t begin, std::span<float> out);

}  // namespace dslaunch::worker
