#include "worker/data_loader.h"

#include <gtest/gtest.h>
#include <stdlib.h>  // mkdtemp

#include <filesystem>  // remove_all, resize_file, file_size
#include <fstream>     // ofstream
#include <memory>
#include <set>
#include <string>
#include <vector>

namespace dslaunch::worker {
namespace {

std::vector<int32_t> Range(int first, int n) {
  std::vector<int32_t> out(n);
  for (int i = 0; i < n; ++i) out[i] = first + i;
  return out;
}

// The rows of several ranks' batches, concatenated in rank order.
std::vector<int32_t> Concat(const std::vector<std::vector<int32_t>>& parts) {
  std::vector<int32_t> out;
  for (const auto& part : parts)
    out.insert(out.end(), part.begin(), part.end());
  return out;
}

class DataLoaderTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string dir = ::testing::TempDir() + "dsl_loader_XXXXXX";
    ASSERT_NE(::mkdtemp(dir.data()), nullptr);
    dir_ = dir + "/";
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  // Writes a shard of `n` tokens first, first + 1, ... and returns its path.
  std::string WriteIota(const std::string& name, int n, int first = 0) {
    std::vector<uint16_t> tokens(n);
    for (int i = 0; i < n; ++i) tokens[i] = static_cast<uint16_t>(first + i);
    const std::string path = dir_ + name;
    Status status = WriteShard(path, tokens);
    EXPECT_TRUE(status.ok()) << status.message();
    return path;
  }

  // Writes a header with the given first three ints and `payload` bytes.
  std::string WriteRaw(const std::string& name, int32_t magic, int32_t version,
                       int32_t count, size_t payload) {
    std::vector<int32_t> header(kShardHeaderInts, 0);
    header[0] = magic;
    header[1] = version;
    header[2] = count;
    const std::string path = dir_ + name;
    std::ofstream out(path, std::ios::binary);
    out.write(reinterpret_cast<const char*>(header.data()), 1024);
    out << std::string(payload, '\0');
    return path;
  }

  std::string OpenError(const std::string& path) {
    StatusOr<Shard> shard = OpenShard(path);
    EXPECT_FALSE(shard.ok()) << path;
    if (shard.ok()) return "";
    EXPECT_EQ(shard.status().code(), StatusCode::kDataError);
    return shard.status().message();
  }

  DataLoaderOptions Options(const std::string& pattern, int b, int t,
                            int rank = 0, int world = 1, bool shuffle = false,
                            uint64_t seed = 0) {
    DataLoaderOptions o;
    o.pattern = dir_ + pattern;
    o.batch_size = b;
    o.seq_len = t;
    o.rank = rank;
    o.world_size = world;
    o.shuffle = shuffle;
    o.seed = seed;
    return o;
  }

  std::unique_ptr<DataLoader> Open(const DataLoaderOptions& options) {
    StatusOr<std::unique_ptr<DataLoader>> loader = DataLoader::Open(options);
    EXPECT_TRUE(loader.ok()) << loader.status().message();
    return loader.ok() ? std::move(*loader) : nullptr;
  }

  std::string dir_;
};

TEST_F(DataLoaderTest, WritesAndOpensShards) {
  const std::string path = WriteIota("a.bin", 3, 7);
  EXPECT_EQ(std::filesystem::file_size(path), 1024u + 6u);
  StatusOr<Shard> shard = OpenShard(path);
  ASSERT_TRUE(shard.ok()) << shard.status().message();
  EXPECT_EQ(shard->path(), path);
  ASSERT_EQ(shard->num_tokens(), 3);
  EXPECT_EQ(shard->tokens()[0], 7);
  EXPECT_EQ(shard->tokens()[2], 9);
  EXPECT_TRUE(shard->ValidateTokens(10).ok());
  Shard moved = std::move(*shard);
  EXPECT_EQ(moved.tokens()[1], 8);
}

TEST_F(DataLoaderTest, RejectsBadMagicAndVersion) {
  const std::string model = WriteRaw("model.bin", 20240326, 3, 0, 0);
  EXPECT_EQ(OpenError(model), model +
                                  ": bad magic 20240326 (expected 20240520: "
                                  "not an llm.c token shard)");
  const std::string v2 = WriteRaw("v2.bin", kShardMagic, 2, 0, 0);
  EXPECT_EQ(OpenError(v2), v2 + ": unsupported shard version 2 (expected 1)");
}

TEST_F(DataLoaderTest, RejectsTruncatedFilesAndWrongTokenCounts) {
  const std::string path = WriteIota("t.bin", 10);
  std::filesystem::resize_file(path, 1024 + 10);
  EXPECT_EQ(OpenError(path), path +
                                 ": header says 10 tokens (20 bytes) but 10 "
                                 "bytes follow the header (truncated)");
  std::filesystem::resize_file(path, 1024 + 22);
  EXPECT_EQ(OpenError(path),
            path +
                ": header says 10 tokens (20 bytes) but 22 bytes follow "
                "the header");
  std::filesystem::resize_file(path, 100);
  EXPECT_EQ(OpenError(path),
            path + ": truncated: 100 bytes, shorter than the 1024-byte header");
  EXPECT_EQ(OpenError(dir_ + "none.bin"),
            dir_ + "none.bin: cannot open: No such file or directory");
}

TEST_F(DataLoaderTest, RejectsTokensOutsideTheVocabulary) {
  const std::string path = dir_ + "v.bin";
  ASSERT_TRUE(WriteShard(path, std::vector<uint16_t>{1, 2, 50257, 3}).ok());
  StatusOr<Shard> shard = OpenShard(path);
  ASSERT_TRUE(shard.ok());
  Status status = shard->ValidateTokens(50257);
  EXPECT_EQ(status.code(), StatusCode::kDataError);
  EXPECT_EQ(status.message(),
            path + ": token 50257 at index 2 is >= vocab_size 50257");
  DataLoaderOptions options = Options("v.bin", 1, 2);
  options.vocab_size = 50257;
  StatusOr<std::unique_ptr<DataLoader>> loader = DataLoader::Open(options);
  ASSERT_FALSE(loader.ok());
  EXPECT_EQ(loader.status().message(), status.message());
}

TEST_F(DataLoaderTest, OneRankReadsConsecutiveWindows) {
  WriteIota("a.bin", 100);
  std::unique_ptr<DataLoader> loader = Open(Options("a.bin", 2, 4));
  ASSERT_NE(loader, nullptr);
  for (int k = 0; k < 12; ++k) {  // (100 - 1) / 4 = 24 sequences
    const Batch& batch = loader->NextBatch();
    EXPECT_EQ(batch.inputs, Range(k * 8, 8)) << k;
    EXPECT_EQ(batch.targets, Range(k * 8 + 1, 8)) << k;
    EXPECT_EQ(loader->state().position, 2 * (k + 1));
  }
}

TEST_F(DataLoaderTest, RanksTakeContiguousPiecesOfEachGlobalBatch) {
  WriteIota("a.bin", 200);
  std::vector<std::unique_ptr<DataLoader>> ranks;
  for (int r = 0; r < 3; ++r)
    ranks.push_back(Open(Options("a.bin", 2, 4, r, 3)));
  for (int k = 0; k < 4; ++k) {
    for (int r = 0; r < 3; ++r) {
      const Batch& batch = ranks[r]->NextBatch();
      EXPECT_EQ(batch.inputs, Range((3 * k + r) * 8, 8)) << k << " " << r;
      EXPECT_EQ(batch.targets, Range((3 * k + r) * 8 + 1, 8));
    }
  }
  EXPECT_EQ(ranks[0]->state(), ranks[2]->state());
}

TEST_F(DataLoaderTest, WrapsToTheNextShardAndEpoch) {
  WriteIota("a.bin", 45);        // 11 sequences: 5 batches, 1 left over
  WriteIota("b.bin", 41, 1000);  // 10 sequences: 5 batches
  std::unique_ptr<DataLoader> loader = Open(Options("*.bin", 2, 4));
  ASSERT_NE(loader, nullptr);
  ASSERT_EQ(loader->paths().size(), 2u);
  for (int k = 0; k < 5; ++k) {
    EXPECT_EQ(loader->NextBatch().inputs, Range(k * 8, 8));
  }
  for (int k = 0; k < 5; ++k) {
    EXPECT_EQ(loader->NextBatch().inputs, Range(1000 + k * 8, 8));
    EXPECT_EQ(loader->state().shard, 1);
  }
  EXPECT_EQ(loader->state().epoch, 0);
  EXPECT_EQ(loader->NextBatch().targets, Range(1, 8));
  EXPECT_EQ(loader->state().epoch, 1);
  EXPECT_EQ(loader->state().shard, 0);
}

// First token of every row of the next `steps` batches.
std::vector<int32_t> RowStarts(DataLoader* loader, int steps) {
  std::vector<int32_t> starts;
  for (int k = 0; k < steps; ++k) {
    const Batch& batch = loader->NextBatch();
    for (int b = 0; b < batch.batch_size; ++b) {
      starts.push_back(batch.inputs[b * batch.seq_len]);
    }
  }
  return starts;
}

TEST_F(DataLoaderTest, ShuffleIsSeededAndVisitsEverySequenceOncePerEpoch) {
  WriteIota("a.bin", 97);  // 24 sequences of 4: 12 batches of 2
  std::unique_ptr<DataLoader> first =
      Open(Options("a.bin", 2, 4, 0, 1, true, 5));
  std::unique_ptr<DataLoader> again =
      Open(Options("a.bin", 2, 4, 0, 1, true, 5));
  std::unique_ptr<DataLoader> other =
      Open(Options("a.bin", 2, 4, 0, 1, true, 6));
  const std::vector<int32_t> epoch0 = RowStarts(first.get(), 12);
  EXPECT_EQ(RowStarts(again.get(), 12), epoch0);
  EXPECT_NE(RowStarts(other.get(), 12), epoch0);
  std::set<int32_t> seen(epoch0.begin(), epoch0.end());
  EXPECT_EQ(seen.size(), 24u);
  EXPECT_EQ(*seen.begin(), 0);
  EXPECT_EQ(*seen.rbegin(), 92);
  const std::vector<int32_t> epoch1 = RowStarts(first.get(), 12);
  EXPECT_EQ(first->state().epoch, 1);
  EXPECT_NE(epoch1, epoch0);
  EXPECT_EQ(std::set<int32_t>(epoch1.begin(), epoch1.end()), seen);
  const Batch& batch = first->NextBatch();  // rows stay whole sequences
  EXPECT_EQ(batch.targets[0], batch.inputs[0] + 1);
  EXPECT_EQ(batch.inputs[3], batch.inputs[0] + 3);
}

TEST_F(DataLoaderTest, RestoredStateContinuesIdentically) {
  WriteIota("a.bin", 45);
  WriteIota("b.bin", 61, 1000);
  const DataLoaderOptions options = Options("*.bin", 2, 4, 0, 1, true, 11);
  std::unique_ptr<DataLoader> loader = Open(options);
  RowStarts(loader.get(), 7);
  const LoaderState saved = loader->state();
  std::vector<std::vector<int32_t>> expected;
  for (int k = 0; k < 25; ++k) expected.push_back(loader->NextBatch().inputs);
  std::unique_ptr<DataLoader> resumed =
      Open(Options("*.bin", 2, 4, 0, 1, true, 99));  // the state's seed wins
  ASSERT_TRUE(resumed->Restore(saved).ok());
  EXPECT_EQ(resumed->state(), saved);
  for (int k = 0; k < 25; ++k) {
    EXPECT_EQ(resumed->NextBatch().inputs, expected[k]) << k;
  }
  EXPECT_EQ(resumed->state(), loader->state());
}

// Runs the ranks of one world for `steps` steps, checking that together
// they read what one rank with world_size times the batch reads.
void ExpectWorldMatchesOneRank(std::vector<std::unique_ptr<DataLoader>>& ranks,
                               DataLoader* single, int steps) {
  for (int k = 0; k < steps; ++k) {
    std::vector<std::vector<int32_t>> parts;
    for (auto& rank : ranks) parts.push_back(rank->NextBatch().inputs);
    EXPECT_EQ(Concat(parts), single->NextBatch().inputs) << k;
  }
}

TEST_F(DataLoaderTest, ResumesAtAnotherWorldSizeFromTheSameGlobalPosition) {
  WriteIota("a.bin", 401);
  WriteIota("b.bin", 301, 2000);
  for (bool shuffle : {false, true}) {
    std::vector<std::unique_ptr<DataLoader>> two;
    for (int r = 0; r < 2; ++r) {
      two.push_back(Open(Options("*.bin", 2, 4, r, 2, shuffle, 3)));
    }
    auto single = Open(Options("*.bin", 4, 4, 0, 1, shuffle, 3));
    ExpectWorldMatchesOneRank(two, single.get(), 5);
    const LoaderState saved = two[1]->state();
    EXPECT_EQ(saved.position, 20);
    std::vector<std::unique_ptr<DataLoader>> three;
    for (int r = 0; r < 3; ++r) {
      three.push_back(Open(Options("*.bin", 2, 4, r, 3, shuffle, 3)));
      ASSERT_TRUE(three[r]->Restore(saved).ok());
    }
    if (!shuffle) {  // rank r continues at sequence 20 + 2r of a.bin
      std::unique_ptr<DataLoader> probe = Open(Options("*.bin", 2, 4, 2, 3));
      ASSERT_TRUE(probe->Restore(saved).ok());
      EXPECT_EQ(probe->NextBatch().inputs, Range((20 + 4) * 4, 8));
    }
    single = Open(Options("*.bin", 6, 4, 0, 1, shuffle, 3));
    ASSERT_TRUE(single->Restore(saved).ok());
    ExpectWorldMatchesOneRank(three, single.get(), 40);  // crosses epochs
    EXPECT_GE(three[0]->state().epoch, 1);
  }
}

TEST_F(DataLoaderTest, RestoreRejectsAStateForOtherData) {
  WriteIota("a.bin", 97);
  std::unique_ptr<DataLoader> loader = Open(Options("a.bin", 2, 4));
  LoaderState state = loader->state();
  state.seq_len = 8;
  EXPECT_EQ(loader->Restore(state).message(),
            "loader state: saved with seq_len 8, this loader has 4");
  state = loader->state();
  state.num_shards = 2;
  EXPECT_EQ(loader->Restore(state).message(),
            "loader state: saved with num_shards 2, this loader has 1");
  state = loader->state();
  state.position = 25;
  Status status = loader->Restore(state);
  EXPECT_EQ(status.code(), StatusCode::kDataError);
  EXPECT_EQ(status.message(),
            "loader state: epoch 0, shard 0, position 25 is past the data");
  EXPECT_EQ(loader->NextBatch().inputs, Range(0, 8));  // unchanged
}

TEST_F(DataLoaderTest, OpenRejectsSmallShardsMissingFilesAndBadRanks) {
  const std::string small = WriteIota("small.bin", 16);
  StatusOr<std::unique_ptr<DataLoader>> loader =
      DataLoader::Open(Options("small.bin", 2, 4, 0, 2));
  ASSERT_FALSE(loader.ok());
  EXPECT_EQ(loader.status().message(),
            small +
                ": 16 tokens, fewer than one global batch needs "
                "(world_size * B * T + 1 = 17)");
  loader = DataLoader::Open(Options("x_*.bin", 1, 4));
  EXPECT_EQ(loader.status().message(), dir_ + "x_*.bin: no files match");
  loader = DataLoader::Open(Options("small.bin", 1, 4, 3, 3));
  EXPECT_EQ(loader.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(loader.status().message(), "data: rank 3 is not in a world of 3");
}

TEST_F(DataLoaderTest, ExpandsGlobsSortedAndResetsToTheStart) {
  WriteIota("c_10.bin", 20);
  WriteIota("c_02.bin", 20, 500);
  StatusOr<std::vector<std::string>> paths = ExpandShardPattern(dir_ + "c_*");
  ASSERT_TRUE(paths.ok());
  EXPECT_EQ(*paths,
            (std::vector<std::string>{dir_ + "c_02.bin", dir_ + "c_10.bin"}));
  std::unique_ptr<DataLoader> loader = Open(Options("c_*", 1, 4));
  EXPECT_EQ(loader->NextBatch().inputs, Range(500, 4));
  loader->NextBatch();
  loader->Reset();
  EXPECT_EQ(loader->state().position, 0);
  EXPECT_EQ(loader->NextBatch().inputs, Range(500, 4));
}

}  // namespace
}  // namespace dslaunch::worker
