#include "worker/data_loader.h"

#include <fcntl.h>     // open
#include <glob.h>      // glob, globfree
#include <sys/mman.h>  // mmap, munmap
#include <sys/stat.h>  // fstat
#include <unistd.h>    // close

#include <algorithm>  // sort, swap
#include <bit>        // endian
#include <cerrno>     // errno
#include <cstdio>     // fopen, fwrite, fclose, rename, remove
#include <cstring>    // memcpy, strerror
#include <limits>     // numeric_limits
#include <numeric>    // iota
#include <utility>    // move

namespace dslaunch::worker {

static_assert(std::endian::native == std::endian::little,
              "llm.c shards are little-endian and are read in place");

namespace {

constexpr size_t kHeaderBytes = kShardHeaderInts * sizeof(int32_t);
constexpr uint64_t kShardOrderStream = ~uint64_t{0};

std::string Errno() { return std::strerror(errno); }

uint64_t SplitMix64(uint64_t* state) {
  uint64_t z = (*state += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// A generator for one (seed, epoch, stream) triple: streams are the shard
// files (their sequence order) and kShardOrderStream (the shard order).
class Rng {
 public:
  Rng(uint64_t seed, int64_t epoch, uint64_t stream) {
    uint64_t s = seed;
    s = SplitMix64(&s) ^ (static_cast<uint64_t>(epoch) * 0xD1B54A32D192ED03ull);
    s = SplitMix64(&s) ^ (stream * 0xC2B2AE3D27D4EB4Full);
    state_ = SplitMix64(&s);
  }
  // Uniform in [0, n) without modulo bias.
  uint64_t Below(uint64_t n) {
    const uint64_t threshold = (0 - n) % n;
    uint64_t r = 0;
    do {
      r = SplitMix64(&state_);
    } while (r < threshold);
    return r % n;
  }

 private:
  uint64_t state_ = 0;
};

template <typename T>
void Shuffle(std::vector<T>* items, Rng* rng) {
  for (size_t i = items->size(); i > 1; --i) {
    std::swap((*items)[i - 1], (*items)[rng->Below(i)]);
  }
}

// Checks the header of a mapped file of `bytes` bytes; returns the number
// of tokens it holds.
StatusOr<size_t> CheckHeader(const std::string& path, const void* map,
                             size_t bytes) {
  int32_t header[3];
  std::memcpy(header, map, sizeof(header));
  if (header[0] != kShardMagic) {
    return DataError(path + ": bad magic " + std::to_string(header[0]) +
                     " (expected " + std::to_string(kShardMagic) +
                     ": not an llm.c token shard)");
  }
  if (header[1] != kShardVersion) {
    return DataError(path + ": unsupported shard version " +
                     std::to_string(header[1]) + " (expected 1)");
  }
  const uint64_t expected = static_cast<uint64_t>(header[2]) * 2;
  const uint64_t actual = bytes - kHeaderBytes;
  if (header[2] < 0 || expected != actual) {
    return DataError(path + ": header says " + std::to_string(header[2]) +
                     " tokens (" + std::to_string(expected) + " bytes) but " +
                     std::to_string(actual) + " bytes follow the header" +
                     (actual < expected ? " (truncated)" : ""));
  }
  return static_cast<size_t>(header[2]);
}

Status CheckOptions(const DataLoaderOptions& o) {
  if (o.pattern.empty()) return InvalidArgument("data: no shard path given");
  if (o.batch_size < 1 || o.seq_len < 1) {
    return InvalidArgument("data: batch size and sequence length must be >= 1");
  }
  if (o.world_size < 1 || o.rank < 0 || o.rank >= o.world_size) {
    return InvalidArgument("data: rank " + std::to_string(o.rank) +
                           " is not in a world of " +
                           std::to_string(o.world_size));
  }
  if (o.vocab_size > 65536) {
    return InvalidArgument("data: vocab_size " + std::to_string(o.vocab_size) +
                           " does not fit uint16 tokens");
  }
  return Status::Ok();
}

}  // namespace

Shard::Shard(std::string path, void* map, size_t map_bytes)
    : path_(std::move(path)), map_(map), map_bytes_(map_bytes) {}

Shard::Shard(Shard&& other) noexcept { *this = std::move(other); }

Shard& Shard::operator=(Shard&& other) noexcept {
  if (this == &other) return *this;
  if (map_ != nullptr) ::munmap(map_, map_bytes_);
  path_ = std::move(other.path_);
  map_ = std::exchange(other.map_, nullptr);
  map_bytes_ = std::exchange(other.map_bytes_, 0);
  tokens_ = std::exchange(other.tokens_, nullptr);
  num_tokens_ = std::exchange(other.num_tokens_, 0);
  return *this;
}

Shard::~Shard() {
  if (map_ != nullptr) ::munmap(map_, map_bytes_);
}

Status Shard::ValidateTokens(int vocab_size) const {
  for (size_t i = 0; i < num_tokens_; ++i) {
    if (tokens_[i] >= vocab_size) {
      return DataError(path_ + ": token " + std::to_string(tokens_[i]) +
                       " at index " + std::to_string(i) + " is >= vocab_size " +
                       std::to_string(vocab_size));
    }
  }
  return Status::Ok();
}

StatusOr<Shard> OpenShard(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return DataError(path + ": cannot open: " + Errno());
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    const std::string error = Errno();
    ::close(fd);
    return DataError(path + ": cannot stat: " + error);
  }
  const size_t bytes = static_cast<size_t>(st.st_size);
  if (bytes < kHeaderBytes) {
    ::close(fd);
    return DataError(path + ": truncated: " + std::to_string(bytes) +
                     " bytes, shorter than the " +
                     std::to_string(kHeaderBytes) + "-byte header");
  }
  void* map = ::mmap(nullptr, bytes, PROT_READ, MAP_PRIVATE, fd, 0);
  const std::string error = Errno();
  ::close(fd);
  if (map == MAP_FAILED) return DataError(path + ": cannot map: " + error);
  Shard shard(path, map, bytes);  // owns the mapping from here on
  ASSIGN_OR_RETURN(shard.num_tokens_, CheckHeader(path, map, bytes));
  shard.tokens_ = reinterpret_cast<const uint16_t*>(
      static_cast<const char*>(map) + kHeaderBytes);
  return shard;
}

Status WriteShard(const std::string& path, std::span<const uint16_t> tokens) {
  if (tokens.size() >
      static_cast<size_t>(std::numeric_limits<int32_t>::max())) {
    return InvalidArgument(path + ": too many tokens for one shard");
  }
  int32_t header[kShardHeaderInts] = {};
  header[0] = kShardMagic;
  header[1] = kShardVersion;
  header[2] = static_cast<int32_t>(tokens.size());
  const std::string tmp = path + ".tmp";
  std::FILE* file = std::fopen(tmp.c_str(), "wb");
  if (file == nullptr) return ErrnoStatus("cannot create " + tmp, errno);
  bool ok = std::fwrite(header, sizeof(header), 1, file) == 1 &&
            std::fwrite(tokens.data(), sizeof(uint16_t), tokens.size(), file) ==
                tokens.size();
  const int write_errno = errno;
  ok = std::fclose(file) == 0 && ok;
  if (!ok) {
    std::remove(tmp.c_str());
    return ErrnoStatus("cannot write " + tmp, write_errno);
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    return ErrnoStatus("cannot rename " + tmp + " to " + path, errno);
  }
  return Status::Ok();
}

StatusOr<std::vector<std::string>> ExpandShardPattern(
    const std::string& pattern) {
  if (pattern.find_first_of("*?[") == std::string::npos) {
    return std::vector<std::string>{pattern};
  }
  glob_t matches{};
  const int rc = ::glob(pattern.c_str(), 0, nullptr, &matches);
  std::vector<std::string> paths;
  for (size_t i = 0; rc == 0 && i < matches.gl_pathc; ++i) {
    paths.emplace_back(matches.gl_pathv[i]);
  }
  ::globfree(&matches);
  if (rc == GLOB_NOMATCH) return DataError(pattern + ": no files match");
  if (rc != 0) return DataError(pattern + ": cannot expand the glob");
  std::sort(paths.begin(), paths.end());
  return paths;
}

StatusOr<std::unique_ptr<DataLoader>> DataLoader::Open(
    const DataLoaderOptions& options) {
  RETURN_IF_ERROR(CheckOptions(options));
  ASSIGN_OR_RETURN(std::vector<std::string> paths,
                   ExpandShardPattern(options.pattern));
  const int64_t need =
      int64_t{options.world_size} * options.batch_size * options.seq_len + 1;
  std::vector<Shard> shards;
  for (const std::string& path : paths) {
    ASSIGN_OR_RETURN(Shard shard, OpenShard(path));
    if (shard.num_tokens() < need) {
      return DataError(path + ": " + std::to_string(shard.num_tokens()) +
                       " tokens, fewer than one global batch needs "
                       "(world_size * B * T + 1 = " +
                       std::to_string(need) + ")");
    }
    if (options.vocab_size > 0) {
      RETURN_IF_ERROR(shard.ValidateTokens(options.vocab_size));
    }
    shards.push_back(std::move(shard));
  }
  return std::unique_ptr<DataLoader>(
      new DataLoader(options, std::move(paths), std::move(shards)));
}

DataLoader::DataLoader(DataLoaderOptions options,
                       std::vector<std::string> paths,
                       std::vector<Shard> shards)
    : options_(std::move(options)),
      paths_(std::move(paths)),
      shards_(std::move(shards)),
      seed_(options_.seed) {
  batch_.batch_size = options_.batch_size;
  batch_.seq_len = options_.seq_len;
  const size_t n = static_cast<size_t>(options_.batch_size) * options_.seq_len;
  batch_.inputs.resize(n);
  batch_.targets.resize(n);
  StartEpoch(0);
}

int64_t DataLoader::global_batch_sequences() const {
  return int64_t{options_.world_size} * options_.batch_size;
}

int64_t DataLoader::NumSequences(size_t file_index) const {
  return (shards_[file_index].num_tokens() - 1) / options_.seq_len;
}

size_t DataLoader::FileIndex() const { return shard_order_[shard_]; }

std::vector<size_t> DataLoader::ShardOrder(uint64_t seed, int64_t epoch) const {
  std::vector<size_t> order(shards_.size());
  std::iota(order.begin(), order.end(), size_t{0});
  if (options_.shuffle) {
    Rng rng(seed, epoch, kShardOrderStream);
    Shuffle(&order, &rng);
  }
  return order;
}

void DataLoader::StartEpoch(int64_t epoch) {
  epoch_ = epoch;
  shard_order_ = ShardOrder(seed_, epoch);
  EnterShard(0);
}

void DataLoader::EnterShard(int64_t shard) {
  shard_ = shard;
  position_ = 0;
  sequence_order_.clear();
  if (!options_.shuffle) return;
  sequence_order_.resize(NumSequences(FileIndex()));
  std::iota(sequence_order_.begin(), sequence_order_.end(), int64_t{0});
  Rng rng(seed_, epoch_, FileIndex());
  Shuffle(&sequence_order_, &rng);
}

void DataLoader::CopySequence(int64_t sequence, int row) {
  const size_t t = options_.seq_len;
  const uint16_t* src = shards_[FileIndex()].tokens().data() + sequence * t;
  int32_t* inputs = batch_.inputs.data() + row * t;
  int32_t* targets = batch_.targets.data() + row * t;
  for (size_t i = 0; i < t; ++i) {
    inputs[i] = src[i];
    targets[i] = src[i + 1];
  }
}

const Batch& DataLoader::NextBatch() {
  const int64_t global = global_batch_sequences();
  if (position_ + global > NumSequences(FileIndex())) {
    if (shard_ + 1 < static_cast<int64_t>(shards_.size())) {
      EnterShard(shard_ + 1);
    } else {
      StartEpoch(epoch_ + 1);
    }
  }
  const int64_t first =
      position_ + int64_t{options_.rank} * options_.batch_size;
  for (int row = 0; row < options_.batch_size; ++row) {
    const int64_t i = first + row;
    CopySequence(options_.shuffle ? sequence_order_[i] : i, row);
  }
  position_ += global;
  return batch_;
}

LoaderState DataLoader::state() const {
  LoaderState s;
  s.epoch = epoch_;
  s.shard = shard_;
  s.position = position_;
  s.seed = seed_;
  s.seq_len = options_.seq_len;
  s.num_shards = static_cast<int64_t>(shards_.size());
  s.shuffle = options_.shuffle;
  return s;
}

Status DataLoader::Restore(const LoaderState& s) {
  const std::string at = "loader state: ";
  auto mismatch = [&](const char* what, int64_t saved, int64_t have) {
    return DataError(at + "saved with " + what + " " + std::to_string(saved) +
                     ", this loader has " + std::to_string(have));
  };
  const auto num_shards = static_cast<int64_t>(shards_.size());
  if (s.seq_len != options_.seq_len) {
    return mismatch("seq_len", s.seq_len, options_.seq_len);
  }
  if (s.num_shards != num_shards) {
    return mismatch("num_shards", s.num_shards, num_shards);
  }
  if (s.shuffle != options_.shuffle) {
    return mismatch("shuffle", s.shuffle, options_.shuffle);
  }
  if (s.epoch < 0 || s.shard < 0 || s.shard >= num_shards || s.position < 0 ||
      s.position > NumSequences(ShardOrder(s.seed, s.epoch)[s.shard])) {
    return DataError(at + "epoch " + std::to_string(s.epoch) + ", shard " +
                     std::to_string(s.shard) + ", position " +
                     std::to_string(s.position) + " is past the data");
  }
  seed_ = s.seed;
  StartEpoch(s.epoch);
  if (s.shard != 0) EnterShard(s.shard);
  position_ = s.position;
  return Status::Ok();
}

void DataLoader::Reset() { StartEpoch(0); }

}  // namespace dslaunch::worker
