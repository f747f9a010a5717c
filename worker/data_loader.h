// Token data for training: llm.c's shard files and a DataLoader that gives
// each rank its piece of every global batch. A Shard owns a read-only
// mapping of one file; a DataLoader owns its shards and is used by one
// thread (the rank's training loop). Both are movable, not copyable.
//
// Shard format (llm.c): int32 header[256] = {20240520 (magic), 1 (version),
// number of tokens, 0...}, then that many uint16 tokens, little-endian.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "base/status.h"  // Status, StatusOr

namespace dslaunch::worker {

inline constexpr int32_t kShardMagic = 20240520;
inline constexpr int32_t kShardVersion = 1;
inline constexpr size_t kShardHeaderInts = 256;

class Shard {
 public:
  Shard(Shard&& other) noexcept;
  Shard& operator=(Shard&& other) noexcept;
  Shard(const Shard&) = delete;
  Shard& operator=(const Shard&) = delete;
  ~Shard();

  const std::string& path() const { return path_; }
  std::span<const uint16_t> tokens() const { return {tokens_, num_tokens_}; }
  int64_t num_tokens() const { return static_cast<int64_t>(num_tokens_); }

  // A token id >= vocab_size is a DataError naming the file and the token's
  // index. Reads the whole shard.
  Status ValidateTokens(int vocab_size) const;

 private:
  friend StatusOr<Shard> OpenShard(const std::string& path);
  Shard(std::string path, void* map, size_t map_bytes);

  std::string path_;
  void* map_ = nullptr;  // owned mmap of the whole file
  size_t map_bytes_ = 0;
  const uint16_t* tokens_ = nullptr;
  size_t num_tokens_ = 0;
};

// Maps the file and checks its header: a file shorter than the header, a
// wrong magic or version, or a token count that does not match the file's
// size is a DataError naming the file.
StatusOr<Shard> OpenShard(const std::string& path);

// Writes a shard (header and tokens) to path.tmp and renames it over `path`.
Status WriteShard(const std::string& path, std::span<const uint16_t> tokens);

// A path, or a glob ("data/train_*.bin") expanded and sorted bytewise. A
// glob matching nothing is a DataError naming it.
StatusOr<std::vector<std::string>> ExpandShardPattern(
    const std::string& pattern);

// Where the next global batch starts: everything needed to resume exactly,
// at any world size or micro batch. Plain value.
struct LoaderState {
  int64_t epoch = 0;
  int64_t shard = 0;     // index into this epoch's shard order
  int64_t position = 0;  // next sequence in that shard's sequence order
  // The RNG state: every permutation is a pure function of (seed, epoch,
  // shard), so seed and epoch are all of it.
  uint64_t seed = 0;
  // Checked on Restore: positions count sequences of this length in this
  // many shards, in shuffled or file order.
  int64_t seq_len = 0;
  int64_t num_shards = 0;
  bool shuffle = false;

  bool operator==(const LoaderState&) const = default;
};

struct DataLoaderOptions {
  std::string pattern;  // a shard path or glob
  int batch_size = 1;   // B: sequences per rank per step (micro batch)
  int seq_len = 1024;   // T
  int rank = 0;
  int world_size = 1;
  bool shuffle = false;
  uint64_t seed = 0;
  int vocab_size = 0;  // > 0: every shard's tokens are checked on open
};

// This rank's B x T inputs and targets (targets are inputs shifted by one
// token), row-major.
struct Batch {
  int batch_size = 0;
  int seq_len = 0;
  std::vector<int32_t> inputs;
  std::vector<int32_t> targets;
};

// The data stream is a list of sequences: sequence i of a shard is tokens
// [i*T, i*T + T + 1) (T inputs and one more for the last target), so a
// shard of n tokens holds (n - 1) / T of them. Global batch k is the next
// world_size * B sequences of the stream, and rank r takes the B sequences
// starting r * B into it. Without shuffle the stream is the shards in sorted
// order and their sequences in order, so on one rank step k reads tokens
// [k*B*T, k*B*T + B*T + 1) of the first shard, and with N ranks rank r reads
// the contiguous [(k*N + r)*B*T, (k*N + r)*B*T + B*T + 1). When the rest of a
// shard cannot hold a whole global batch, the stream moves on to the next shard
// (the rest is skipped, as in llm.c); after the last shard a new epoch
// starts. With shuffle, each epoch visits the shards in a seeded random
// order and each shard's sequences in a seeded random order (Fisher-Yates
// driven by SplitMix64 keyed by seed, epoch and shard: the same on every
// machine and standard library). Shuffling whole sequences rather than whole
// batches keeps the stream independent of B and world_size, so a state saved
// at one world size resumes at another at the same global position.
class DataLoader {
 public:
  // Expands the pattern, maps every shard and checks that each holds at
  // least one global batch. Errors are DataErrors naming the file, or an
  // InvalidArgument for bad options.
  static StatusOr<std::unique_ptr<DataLoader>> Open(
      const DataLoaderOptions& options);

  // Fills this rank's piece of the next global batch and advances past the
  // whole global batch. The reference stays valid until the next call.
  const Batch& NextBatch();

  // Position of the next global batch; the same on every rank.
  LoaderState state() const;
  // Continues from `state` (saved at any world size or B). A state for a
  // different sequence length, shard count or shuffle setting, or one
  // pointing past the data, is a DataError. Adopts the state's seed.
  Status Restore(const LoaderState& state);
  // Back to the start of epoch 0 (for evaluation passes).
  void Reset();

  const std::vector<std::string>& paths() const { return paths_; }
  // Sequences one global batch takes: world_size * B.
  int64_t global_batch_sequences() const;

 private:
  DataLoader(DataLoaderOptions options, std::vector<std::string> paths,
             std::vector<Shard> shards);
  int64_t NumSequences(size_t file_index) const;
  size_t FileIndex() const;  // the file of the current shard
  std::vector<size_t> ShardOrder(uint64_t seed, int64_t epoch) const;
  void StartEpoch(int64_t epoch);
  void EnterShard(int64_t shard);
  void CopySequence(int64_t sequence, int row);

  const DataLoaderOptions options_;
  const std::vector<std::string> paths_;
  std::vector<Shard> shards_;  // file (sorted path) order
  Batch batch_;
  uint64_t seed_;
  int64_t epoch_ = 0;
  int64_t shard_ = 0;
  int64_t position_ = 0;
  std::vector<size_t> shard_order_;      // this epoch's file order
  std::vector<int64_t> sequence_order_;  // empty without shuffle
};

}  // namespace dslaunch::worker
