// ZeroState: the parameter, gradient and optimizer state of one rank under
// ZeRO stage 2 or 3, served to the Model as its ParamSource. Every hook
// layer's range (kLayerMajor: one contiguous range per layer) is split
// evenly across ranks; a rank keeps its piece of every layer's gradients and
// AdamW moments (stage 2) and of its parameters too (stage 3), one flat
// buffer per kind holding the pieces layer after layer. Gradients are
// reduce-scattered in buckets (PlanGradBuckets) as backward produces them,
// through a working window reused for every bucket; under stage 3 each
// layer's parameters are all-gathered into a window just before the layer
// needs them. Owned by the Trainer; single-threaded (the hooks run on the
// training thread), the passes over whole buffers on the OpenMP team.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "worker/comm.h"
#include "worker/cpu_adam.h"
#include "worker/model.h"
#include "worker/partition.h"

namespace dslaunch::worker {

struct RankShard;  // worker/checkpoint.h

// Layers lo..hi of the blocks (0..L-1) and the final LayerNorm (L), whose
// gradients are reduce-scattered together.
struct GradBucket {
  int lo = 0, hi = 0;
  bool operator==(const GradBucket&) const = default;
};

// DeepSpeed's reduce_bucket_size (elements) over the layers' gradient sizes
// (sizes[l] for layer l = 0..L): backward finishes layers from L down to 0,
// and a bucket closes when the next layer would take it past `bucket_elems`.
// A layer larger than that is a bucket of its own: backward produces a
// layer's gradients all at once, so cutting one finer saves nothing. The
// embedding (layer -1) is never in a bucket with others: the head adds into
// its gradients at the start of backward. Returned from the highest layers
// down, in the order they are reduced.
std::vector<GradBucket> PlanGradBuckets(std::span<const size_t> sizes,
                                        int64_t bucket_elems);

class ZeroState : public ParamSource {
 public:
  // REQUIRES: layout in kLayerMajor order, stage 2 or 3, bucket_elems >= 1.
  ZeroState(const ParamLayout& layout, int stage, Comm* comm,
            int64_t bucket_elems);
  ~ZeroState() override;

  // Parameters from the GPT-2 init with `seed` (bit-identical to a whole
  // model's), or from whole parameters in `layout` order.
  void InitParams(uint64_t seed);
  void LoadParams(std::span<const float> full);
  // How backward fills the gradient windows: the Model adds into them
  // (zeroed as each bucket opens), or a device engine copies each layer's
  // gradients in whole (TakeLayerGrads; left as they are). Under kCopied
  // before_backward leaves the gradient windows alone, so after_backward(l)
  // may come after before_backward(l - 1) (the GPU engine's overlap).
  enum class GradWindows { kAdded, kCopied };
  // The hooks to install on the Model with this source, or to call from a
  // device engine's.
  LayerHooks Hooks(GradWindows windows = GradWindows::kAdded);

  float* LayerParams(int layer) override;
  float* LayerGrads(int layer) override;

  // The owned gradient pieces count as zeros from here, before a step's
  // micro-batches: each layer's first reduce writes its sum over them, and
  // whatever reads them first zeroes those no reduce reached.
  void ZeroGrad();
  // The first collective error inside a hook (hooks cannot return one).
  const Status& status() const { return status_; }
  // Averages the owned gradients over ranks and returns the global norm
  // (SquaredSum over the whole owned buffer, padding included).
  StatusOr<float> FinishGradients();
  // Who gathers stage 2's updated pieces into every rank's whole
  // parameters: this, over the Comm (GatherParams), or a device's
  // collectives (the host's whole parameters then hold only this rank's
  // pieces fresh).
  enum class GatheredBy { kThis, kTheDevice };
  // AdamW on the owned pieces (gradients scaled by clip_scale, the buffer
  // left as it is) and GatherParams, layer by layer; with `updated`, called
  // with each layer's range of Buffer(kParams) once it is final (stage 2:
  // the layer's whole range, or its owned piece's real part when the
  // device gathers; stage 3: its owned piece).
  Status Update(const AdamParams& adam, float clip_scale,
                const ParamsUpdated& updated = nullptr,
                GatheredBy gather = GatheredBy::kThis);
  // Stage 2: every rank's updated pieces into every rank's whole
  // parameters (collective); nothing under stage 3 or on one rank. With
  // `updated`, called as Update calls it.
  Status GatherParams(const ParamsUpdated& updated = nullptr);

  // One contiguous run of the optimizer step, within one layer's owned
  // piece and one weight-decay segment: `count` parameters at `param` in
  // Buffer(kParams), their gradients at `grad` and moments at `moment` in
  // the owned buffers. Update steps through these; the GPU engine hands
  // them to its device.
  struct AdamRun {
    size_t param = 0, grad = 0, moment = 0, count = 0;
    bool decay = false;
  };
  const std::vector<AdamRun>& adam_runs() const { return adam_runs_; }

  // Hook layer l's piece (l = -1..L): `at` in the owned buffers, `shard`
  // floats there (padding included), `own` real ones from `begin` in the
  // layout; the layer's range split in world shards of `shard`.
  struct OwnedPiece {
    size_t at = 0, shard = 0, begin = 0, own = 0;
  };
  OwnedPiece owned_piece(int layer) const;
  // Parameters, gradients and moments this rank keeps (not the windows).
  int64_t state_bytes() const;
  // Every rank's pieces gathered into whole buffers in layout order (for
  // checkpoints and export); collective, and holds one whole buffer.
  enum class Which { kParams, kGrads, kM, kV };
  StatusOr<std::vector<float>> GatherAll(Which which);
  // The state buffers themselves: kParams the whole parameters (stage 2) or
  // the owned pieces (stage 3); the others the owned pieces, every layer's
  // in turn, each padded to its shard (owned_floats() floats).
  std::span<float> Buffer(Which which);
  size_t owned_floats() const { return own_grads_.size(); }
  // Every buffer this holds (state and windows), for a device engine that
  // copies to and from them to pin; allocated once, they never move.
  std::vector<std::span<float>> buffers();
  // Takes this rank's pieces of whole parameters and moments (layout order).
  void LoadState(std::span<const float> params, std::span<const float> m,
                 std::span<const float> v);

  // Checkpoints, which keep llm.c's order: parameters and moments of
  // [begin, begin + count) of it (collective; valid until the next call);
  // this rank's state from a complete checkpoint written at any world
  // size by any engine; every parameter in llm.c's order (collective).
  StatusOr<RankShard> CheckpointRange(size_t begin, size_t count);
  Status Resume(const std::string& dir);
  StatusOr<std::vector<float>> WholeParams();

  int num_buckets() const { return static_cast<int>(buckets_.size()); }

  struct Layer;  // defined in zero_state.cc
  struct Bucket {
    GradBucket layers;
    size_t window = 0;  // floats its layers take in its window (padded)
    size_t shard = 0;   // floats of each rank's piece (its layers' shards)
  };

 private:
  Layer& L(int layer) { return *layers_[layer + 1]; }
  void Gather(int layer, float* window);
  Status GatherLayer(Layer& l);
  Status LayerUpdated(Layer& l, const ParamsUpdated& updated,
                      GatheredBy gather);
  void ReduceBucket(const Bucket& b, float* window);
  float* RankMajor(const Bucket& b, float* window);
  void ZeroGradWindows(int layer);
  void ZeroStaleGrads();
  void PlanBuckets(int64_t bucket_elems, size_t max_block);
  void Fail(const Status& st);

  const ParamLayout& layout_;
  int stage_;
  Comm* comm_;
  std::vector<std::unique_ptr<Layer>> layers_;  // hook layers -1..L
  std::vector<Bucket> buckets_;                 // layers 0..L
  Bucket emb_bucket_;                           // layer -1, on its own
  std::vector<float> full_params_;              // stage 2: every parameter
  // What this rank owns: every layer's piece in turn (Layer's spans).
  std::vector<float> own_params_;  // stage 3
  std::vector<float> own_grads_, own_m_, own_v_;
  std::vector<float> emb_params_, block_params_;  // stage 3 windows
  std::vector<float> emb_grads_, block_grads_;    // gradient windows
  std::vector<float> rank_major_;  // a many-layer bucket, as it is sent
  std::vector<float> staging_;     // a rank's piece of a layer, padded
  std::vector<AdamRun> adam_runs_;
  std::vector<std::vector<float>> whole_;  // a checkpoint's gathered state
  Status status_;
};

}  // namespace dslaunch::worker
