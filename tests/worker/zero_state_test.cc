// ZeroState at 1-4 ranks as threads over LocalWorld (no Gloo): which rank
// owns which gradients, the bucketed reduce-scatter at several bucket sizes,
// gathering sharded parameters and moments, the bytes each rank keeps, and
// a failed collective becoming a Status on every rank.
#include "worker/zero_state.h"

#include <gtest/gtest.h>
#include <omp.h>  // omp_get_max_threads, omp_set_num_threads

#include <chrono>
#include <cstring>
#include <memory>
#include <random>
#include <vector>

#include "tests/worker/model_test_util.h"
#include "worker/comm_local.h"
#include "worker/partition.h"

namespace dslaunch::worker {
namespace {

constexpr uint64_t kSeed = 7;

// One rank's model and ZeroState over `comm`, parameters from kSeed.
struct RankModel {
  RankModel(Comm& comm, int stage, int64_t bucket_elems)
      : threads((omp_set_num_threads(1), 1)),
        model(Model::Create(Tiny(), ParamOrder::kLayerMajor).value()),
        zero(model->layout(), stage, &comm, bucket_elems) {
    zero.InitParams(kSeed);
    model->set_hooks(zero.Hooks());
    model->set_param_source(&zero);
  }
  // One forward and backward of rank r's batch into the owned gradients.
  void Backward(int rank) {
    zero.ZeroGrad();
    MicroBatch(100 + rank);
  }
  // Batch `seed`'s gradients added into the owned ones.
  void MicroBatch(int seed) {
    Forward(*model, MakeBatch(Tiny(), 2, 8, seed));
    model->Backward();
  }
  int threads;  // one OpenMP thread per rank: the ranks are threads already
  std::unique_ptr<Model> model;
  ZeroState zero;
};

// Batch `seed`'s gradients from a plain model that owns whole buffers.
std::vector<float> PlainGrads(int seed) {
  const int saved = omp_get_max_threads();
  omp_set_num_threads(1);  // as the ranks run (no oversubscribed team)
  auto m = NewModel(Tiny(), kSeed, ParamOrder::kLayerMajor);
  m->ZeroGrad();
  Forward(*m, MakeBatch(Tiny(), 2, 8, seed));
  m->Backward();
  omp_set_num_threads(saved);
  auto g = m->grads().first(m->layout().num_params());
  return {g.begin(), g.end()};
}

// What ZeroState must produce: every layer split evenly by its own
// partition; element i summed in the ring's order starting right after its
// owner (comm_gloo.cc), then scaled by 1/N.
std::vector<float> ExpectedMeanGrads(int world) {
  std::vector<std::vector<float>> g;
  for (int r = 0; r < world; ++r) g.push_back(PlainGrads(100 + r));
  const ParamLayout layout(Tiny(), ParamOrder::kLayerMajor);
  std::vector<float> out(layout.num_params());
  const float scale = 1.0f / static_cast<float>(world);
  for (int l = -1; l <= Tiny().num_layers; ++l) {
    const ParamRange range = layout.LayerRanges(l).at(0);
    const Partition part = MakePartition(range.size(), world);
    for (size_t i = range.begin; i < range.end; ++i) {
      const int owner = static_cast<int>((i - range.begin) / part.shard);
      float acc = g[(owner + 1) % world][i];
      for (int k = 2; k <= world; ++k) acc += g[(owner + k) % world][i];
      out[i] = acc * scale;
    }
  }
  return out;
}

// AdamW with beta1 = 0 and lr = 0 leaves the parameters and makes the first
// moment the gradient itself, so GatherAll(kM) shows the reduced gradients.
AdamParams MomentIsGradient() {
  AdamParams a;
  a.lr = 0;
  a.beta1 = 0;
  a.weight_decay = 0;
  return a;
}

void ExpectBitEqual(const std::vector<float>& got,
                    const std::vector<float>& want, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  size_t bad = 0, first = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    if (std::memcmp(&got[i], &want[i], sizeof(float)) != 0 && bad++ == 0)
      first = i;
  }
  EXPECT_EQ(bad, 0u) << what << ": first difference at " << first << ": "
                     << got[first] << " vs " << want[first];
}

void ExpectAllOk(const std::vector<Status>& results) {
  for (size_t r = 0; r < results.size(); ++r)
    EXPECT_TRUE(results[r].ok())
        << "rank " << r << ": " << results[r].ToString();
}

TEST(ZeroState, ReducedGradientsAreTheRingSumOfEveryRanksGradients) {
  const ParamLayout layout(Tiny(), ParamOrder::kLayerMajor);
  // 1: one bucket per layer; 3000: several layers per bucket; 1e9: one.
  for (int world = 1; world <= 4; ++world) {
    const std::vector<float> want = ExpectedMeanGrads(world);
    for (int stage : {2, 3}) {
      for (int64_t bucket : {int64_t{1}, int64_t{3000}, int64_t{1000000000}}) {
        LocalWorld w(world);
        std::vector<std::vector<float>> got(world);
        ExpectAllOk(RunRanks(w, [&](Comm& comm) -> Status {
          RankModel rm(comm, stage, bucket);
          rm.Backward(comm.rank());
          RETURN_IF_ERROR(rm.zero.status());
          RETURN_IF_ERROR(rm.zero.FinishGradients().status());
          RETURN_IF_ERROR(rm.zero.Update(MomentIsGradient(), 1.0f));
          ASSIGN_OR_RETURN(got[comm.rank()],
                           rm.zero.GatherAll(ZeroState::Which::kM));
          return Status::Ok();
        }));
        for (int r = 0; r < world; ++r) {
          ExpectBitEqual(got[r], want,
                         "world " + std::to_string(world) + " stage " +
                             std::to_string(stage) + " bucket " +
                             std::to_string(bucket) + " rank " +
                             std::to_string(r));
        }
      }
    }
  }
}

// ZeroGrad writes nothing: the first micro-batch's reduce writes each
// piece, the next ones add, and pieces no reduce reached read as zeros.
TEST(ZeroState, MicroBatchesAddUpFromZeroGradAndNoBackwardLeavesZeros) {
  for (int world : {1, 2}) {
    // 2 ranks add each element's two values once, in either order.
    std::vector<float> want = PlainGrads(100), second = PlainGrads(200);
    for (int r = 1; r < world; ++r) {
      const std::vector<float> a = PlainGrads(100 + r), b = PlainGrads(200 + r);
      for (size_t i = 0; i < want.size(); ++i) {
        want[i] += a[i];
        second[i] += b[i];
      }
    }
    for (size_t i = 0; i < want.size(); ++i) want[i] += second[i];
    LocalWorld w(world);
    std::vector<std::vector<float>> got(world), zeros(world);
    std::vector<float> norms(world);
    ExpectAllOk(RunRanks(w, [&](Comm& comm) -> Status {
      RankModel rm(comm, 2, 3000);
      rm.Backward(comm.rank());
      rm.zero.ZeroGrad();
      rm.MicroBatch(100 + comm.rank());
      rm.MicroBatch(200 + comm.rank());
      ASSIGN_OR_RETURN(got[comm.rank()],
                       rm.zero.GatherAll(ZeroState::Which::kGrads));
      rm.zero.ZeroGrad();
      ASSIGN_OR_RETURN(norms[comm.rank()], rm.zero.FinishGradients());
      ASSIGN_OR_RETURN(zeros[comm.rank()],
                       rm.zero.GatherAll(ZeroState::Which::kGrads));
      return Status::Ok();
    }));
    for (int r = 0; r < world; ++r) {
      const std::string at =
          "world " + std::to_string(world) + " rank " + std::to_string(r);
      ExpectBitEqual(got[r], want, at);
      ExpectBitEqual(zeros[r], std::vector<float>(want.size()), at);
      EXPECT_EQ(norms[r], 0.0f) << at;
    }
  }
}

TEST(ZeroState, BucketSizeDecidesHowManyReduceScattersRun) {
  // Per backward: one reduce-scatter per bucket plus the embedding's; the
  // all-reduce of the norm is one more.
  for (int64_t bucket : {int64_t{1}, int64_t{3000}, int64_t{1000000000}}) {
    LocalWorld w(2);
    std::vector<int> buckets(2);
    ExpectAllOk(RunRanks(w, [&](Comm& comm) -> Status {
      RankModel rm(comm, 2, bucket);
      buckets[comm.rank()] = rm.zero.num_buckets();
      rm.Backward(comm.rank());
      return rm.zero.status();
    }));
    EXPECT_EQ(w.calls(0), buckets[0] + 1) << bucket;
    if (bucket == 1) {
      EXPECT_EQ(buckets[0], Tiny().num_layers + 1);
    }
    if (bucket == 1000000000) {
      EXPECT_EQ(buckets[0], 1);
    }
  }
}

TEST(ZeroState, GatherAllGivesTheWholeInitialParametersOnEveryRank) {
  auto plain = NewModel(Tiny(), kSeed, ParamOrder::kLayerMajor);
  const auto p = plain->params().first(plain->layout().num_params());
  const std::vector<float> want(p.begin(), p.end());
  for (int world = 1; world <= 4; ++world) {
    for (int stage : {2, 3}) {
      LocalWorld w(world);
      std::vector<std::vector<float>> got(world);
      ExpectAllOk(RunRanks(w, [&](Comm& comm) -> Status {
        RankModel rm(comm, stage, 1000);
        ASSIGN_OR_RETURN(got[comm.rank()],
                         rm.zero.GatherAll(ZeroState::Which::kParams));
        return Status::Ok();
      }));
      for (int r = 0; r < world; ++r)
        ExpectBitEqual(got[r], want, "world " + std::to_string(world));
    }
  }
}

// Sum over layers -1..L of each layer's shard at `world` ranks.
int64_t OwnedFloats(int world) {
  const ParamLayout layout(Tiny(), ParamOrder::kLayerMajor);
  int64_t owned = 0;
  for (int l = -1; l <= Tiny().num_layers; ++l)
    owned += MakePartition(layout.LayerRanges(l).at(0).size(), world).shard;
  return owned;
}

TEST(ZeroState, StateBytesCountOnlyWhatTheRankKeeps) {
  const int64_t n = ParamLayout(Tiny(), ParamOrder::kLayerMajor).num_params();
  for (int world = 1; world <= 4; ++world) {
    LocalWorld w2(world), w3(world);
    std::vector<int64_t> s2(world), s3(world);
    ExpectAllOk(RunRanks(w2, [&](Comm& comm) {
      s2[comm.rank()] = RankModel(comm, 2, 1000).zero.state_bytes();
      return Status::Ok();
    }));
    ExpectAllOk(RunRanks(w3, [&](Comm& comm) {
      s3[comm.rank()] = RankModel(comm, 3, 1000).zero.state_bytes();
      return Status::Ok();
    }));
    // Stage 2: whole parameters, a piece of gradients and both moments;
    // stage 3: a piece of all four.
    EXPECT_EQ(s2[world - 1], 4 * (n + 3 * OwnedFloats(world))) << world;
    EXPECT_EQ(s3[world - 1], 4 * 4 * OwnedFloats(world)) << world;
  }
  EXPECT_LT(4 * 4 * OwnedFloats(4), 4 * 4 * OwnedFloats(1) / 3);
}

TEST(ZeroState, LoadStateThenGatherAllRoundTripsParamsAndMoments) {
  const size_t n = ParamLayout(Tiny(), ParamOrder::kLayerMajor).num_params();
  std::vector<std::vector<float>> state(3, std::vector<float>(n));
  std::mt19937 rng(3);
  std::normal_distribution<float> d(0.0f, 1.0f);
  for (auto& v : state)
    for (float& x : v) x = d(rng);
  for (int world : {1, 3, 4}) {
    for (int stage : {2, 3}) {
      LocalWorld w(world);
      std::vector<std::vector<std::vector<float>>> got(world);
      ExpectAllOk(RunRanks(w, [&](Comm& comm) -> Status {
        RankModel rm(comm, stage, 1000);
        rm.zero.LoadState(state[0], state[1], state[2]);
        for (auto which : {ZeroState::Which::kParams, ZeroState::Which::kM,
                           ZeroState::Which::kV}) {
          ASSIGN_OR_RETURN(auto whole, rm.zero.GatherAll(which));
          got[comm.rank()].push_back(std::move(whole));
        }
        return Status::Ok();
      }));
      for (int r = 0; r < world; ++r)
        for (int k = 0; k < 3; ++k)
          ExpectBitEqual(
              got[r][k], state[k],
              "world " + std::to_string(world) + " kind " + std::to_string(k));
    }
  }
}

TEST(ZeroState, ALostPeerMidBackwardIsAStatusOnEveryRankNotAHang) {
  for (int stage : {2, 3}) {
    for (int64_t nth : {1, 2, 3}) {
      LocalWorld w(3, std::chrono::seconds(5));
      w.FailAt(1, nth);  // rank 1's nth collective: a gather or a bucket
      const auto t0 = std::chrono::steady_clock::now();
      std::vector<Status> results = RunRanks(w, [&](Comm& comm) -> Status {
        RankModel rm(comm, stage, 1);
        rm.Backward(comm.rank());
        RETURN_IF_ERROR(rm.zero.status());
        RETURN_IF_ERROR(rm.zero.FinishGradients().status());
        return rm.zero.Update(MomentIsGradient(), 1.0f);
      });
      EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(2));
      for (int r = 0; r < 3; ++r) {
        EXPECT_EQ(results[r].code(), StatusCode::kUnavailable)
            << "stage " << stage << " nth " << nth << " rank " << r;
        EXPECT_NE(results[r].message().find("rank 1 lost its connection"),
                  std::string::npos)
            << results[r].message();
      }
    }
  }
}

}  // namespace
}  // namespace dslaunch::worker
