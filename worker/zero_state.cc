#include "worker/zero_state.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "worker/checkpoint.h"
#include "worker/flat_math.h"

namespace dslaunch::worker {
namespace {

// Checkpoints keep llm.c's order; stages 2 and 3 train in kLayerMajor.
std::vector<float> Reorder(const ParamLayout& from, std::span<const float> src,
                           const ParamLayout& to) {
  std::vector<float> dst(to.num_params());
  for (const TensorInfo& t : from.Tensors()) {
    const ParamRange r = to.Range(t.kind, t.layer < 0 ? 0 : t.layer);
    std::copy(src.begin() + t.range.begin, src.begin() + t.range.end,
              dst.begin() + r.begin);
  }
  return dst;
}

}  // namespace

struct ZeroState::Layer {
  ParamRange range;               // in the layout
  Partition part;                 // of the range across ranks
  size_t own_begin = 0, own = 0;  // this rank's real piece, relative to range
  // The owned pieces (part.shard floats each), in the flat owned buffers.
  std::span<float> params;  // stage 3 only
  std::span<float> grads, m, v;
  size_t runs_begin = 0, runs_end = 0;  // its AdamRuns in adam_runs_
  int bucket = -1;                      // index in buckets_ (layers 0..L)
  size_t window_offset = 0;  // where its gradients sit in block_grads_
  // From ZeroGrad to its first reduce: grads count as zeros, whatever they
  // hold.
  bool grads_stale = false;
};

std::vector<GradBucket> PlanGradBuckets(std::span<const size_t> sizes,
                                        int64_t bucket_elems) {
  std::vector<GradBucket> buckets;
  const size_t cap = static_cast<size_t>(std::max<int64_t>(1, bucket_elems));
  size_t filled = 0;
  for (int l = static_cast<int>(sizes.size()) - 1; l >= 0; --l) {
    if (buckets.empty() || filled + sizes[l] > cap) {
      buckets.push_back({l, l});
      filled = 0;
    }
    buckets.back().lo = l;
    filled += sizes[l];
  }
  return buckets;
}

ZeroState::ZeroState(const ParamLayout& layout, int stage, Comm* comm,
                     int64_t bucket_elems)
    : layout_(layout), stage_(stage), comm_(comm) {
  DSL_CHECK(layout.order() == ParamOrder::kLayerMajor &&
            (stage == 2 || stage == 3) && bucket_elems >= 1);
  const int last = layout.config().num_layers, r = comm->rank();
  size_t max_emb = 0, max_block = 0, owned = 0;
  for (int l = -1; l <= last; ++l) {
    auto layer = std::make_unique<Layer>();
    layer->range = layout.LayerRanges(l).at(0);
    layer->part = MakePartition(layer->range.size(), comm->size());
    // A rank past the layer's end owns nothing; its piece starts at the end.
    layer->own_begin = std::min(layer->part.begin(r), layer->range.size());
    layer->own = layer->part.real(r);
    owned += layer->part.shard;
    (l == -1 ? max_emb : max_block) =
        std::max(l == -1 ? max_emb : max_block, layer->part.padded());
    layers_.push_back(std::move(layer));
  }
  // One flat buffer per kind; layer by layer, each piece padded to its shard.
  if (stage == 3) own_params_.assign(owned, 0.0f);
  own_grads_.assign(owned, 0.0f);
  own_m_.assign(owned, 0.0f);
  own_v_.assign(owned, 0.0f);
  size_t at = 0;
  const auto& segments = layout.DecaySegments();
  for (auto& l : layers_) {
    const size_t shard = l->part.shard;
    if (stage == 3) l->params = std::span(own_params_).subspan(at, shard);
    l->grads = std::span(own_grads_).subspan(at, shard);
    l->m = std::span(own_m_).subspan(at, shard);
    l->v = std::span(own_v_).subspan(at, shard);
    // The owned piece [lo, hi) of the layout, cut at the decay segments.
    const size_t lo = l->range.begin + l->own_begin, hi = lo + l->own;
    l->runs_begin = adam_runs_.size();
    for (const DecaySegment& seg : segments) {
      const size_t b = std::max(lo, seg.range.begin),
                   e = std::min(hi, seg.range.end);
      if (b >= e) continue;
      const size_t in_piece = at + (b - lo);
      adam_runs_.push_back(
          {stage == 2 ? b : in_piece, in_piece, in_piece, e - b, seg.decay});
    }
    l->runs_end = adam_runs_.size();
    at += shard;
  }
  if (stage == 2) full_params_.assign(layout.num_params(), 0.0f);
  if (stage == 3) {
    emb_params_.assign(max_emb, 0.0f);
    block_params_.assign(max_block, 0.0f);
  }
  emb_grads_.assign(max_emb, 0.0f);
  emb_bucket_ = {{-1, -1}, L(-1).part.padded(), L(-1).part.shard};
  PlanBuckets(bucket_elems, max_block);
  staging_.assign(std::max(max_emb, max_block) / comm->size(), 0.0f);
}

// Fills buckets_ and each block layer's place in block_grads_, and sizes
// the gradient windows.
void ZeroState::PlanBuckets(int64_t bucket_elems, size_t max_block) {
  std::vector<size_t> sizes;
  const int last = layout_.config().num_layers;
  for (int l = 0; l <= last; ++l) sizes.push_back(L(l).part.padded());
  size_t max_window = max_block;
  bool needs_copy = false;  // a bucket of several layers on several ranks
  for (const GradBucket& g : PlanGradBuckets(sizes, bucket_elems)) {
    Bucket b{g};
    for (int l = g.lo; l <= g.hi; ++l) {
      L(l).bucket = static_cast<int>(buckets_.size());
      L(l).window_offset = b.window;
      b.window += L(l).part.padded();
      b.shard += L(l).part.shard;
    }
    max_window = std::max(max_window, b.window);
    needs_copy = needs_copy || (g.lo != g.hi && comm_->size() > 1);
    buckets_.push_back(b);
  }
  block_grads_.assign(max_window, 0.0f);
  if (needs_copy) rank_major_.assign(max_window, 0.0f);
}

ZeroState::~ZeroState() = default;

void ZeroState::InitParams(uint64_t seed) {
  if (stage_ == 2) {
    InitParamRange(layout_, seed, {0, layout_.num_params()}, full_params_);
    return;
  }
  for (auto& l : layers_) {
    const size_t b = l->range.begin + l->own_begin;
    InitParamRange(layout_, seed, {b, b + l->own}, l->params.first(l->own));
  }
}

void ZeroState::LoadParams(std::span<const float> full) {
  if (stage_ == 2) {
    std::copy(full.begin(), full.begin() + layout_.num_params(),
              full_params_.begin());
    return;
  }
  for (auto& l : layers_) {
    const float* src = full.data() + l->range.begin + l->own_begin;
    std::copy(src, src + l->own, l->params.begin());
  }
}

void ZeroState::Fail(const Status& st) {
  if (status_.ok() && !st.ok()) status_ = st;
}

// All-gathers layer's pieces into `window` (padded size).
void ZeroState::Gather(int layer, float* window) {
  Layer& l = L(layer);
  Fail(comm_->AllGather(l.params.data(), window, l.part.shard));
}

// Reduce-scatters a bucket's gradient window (clobbered) and adds this
// rank's summed pieces into its owned gradients (micro-batches accumulate).
// Each layer stays split across ranks by its own partition, so what is sent
// must be rank-major: rank r's piece of every layer in turn, each padded to
// its shard. The sum of this rank's lands in place, in what was sent.
void ZeroState::ReduceBucket(const Bucket& b, float* window) {
  float* send = RankMajor(b, window);
  const size_t rank = static_cast<size_t>(comm_->rank());
  float* piece = send + rank * b.shard;
  Fail(comm_->ReduceScatterSum(send, piece, b.shard));
  for (int l = b.layers.lo; l <= b.layers.hi; ++l) {
    Layer& layer = L(l);
    Accumulate(layer.grads, {piece, layer.part.shard}, layer.grads_stale);
    layer.grads_stale = false;
    piece += layer.part.shard;
  }
}

// The bucket's gradients in rank-major order, padding zeroed. A single layer
// (or any bucket on one rank) is in its window already; a bucket of several
// layers is copied into rank_major_.
float* ZeroState::RankMajor(const Bucket& b, float* window) {
  const GradBucket& g = b.layers;
  if (g.lo == g.hi || comm_->size() == 1) {
    for (int l = g.lo; l <= g.hi; ++l) {
      const Layer& layer = L(l);
      std::fill(window + layer.window_offset + layer.range.size(),
                window + layer.window_offset + layer.part.padded(), 0.0f);
    }
    return window;
  }
  float* out = rank_major_.data();
  for (int r = 0; r < comm_->size(); ++r) {
    for (int l = g.lo; l <= g.hi; ++l) {
      const Layer& layer = L(l);
      const size_t real = layer.part.real(r);
      Copy({window + layer.window_offset + layer.part.begin(r), real}, out);
      std::fill(out + real, out + layer.part.shard, 0.0f);
      out += layer.part.shard;
    }
  }
  return rank_major_.data();
}

// Zeroes the gradient windows layer's backward opens, for the Model to add
// into: the head's adds into dwte, so layer -1's window opens with it; a
// bucket's opens with its first layer in backward.
void ZeroState::ZeroGradWindows(int layer) {
  if (layer == layout_.config().num_layers)
    std::fill(emb_grads_.begin(), emb_grads_.end(), 0.0f);
  if (layer < 0) return;
  const Bucket& b = buckets_[L(layer).bucket];
  if (layer == b.layers.hi)
    std::fill(block_grads_.begin(), block_grads_.begin() + b.window, 0.0f);
}

LayerHooks ZeroState::Hooks(GradWindows windows) {
  LayerHooks h;
  h.before_forward = [this](int layer) {
    if (stage_ == 3)
      Gather(layer, layer == -1 ? emb_params_.data() : block_params_.data());
  };
  h.before_backward = [this, windows](int layer) {
    if (windows == GradWindows::kAdded) ZeroGradWindows(layer);
    if (stage_ == 3 && layer >= 0) Gather(layer, block_params_.data());
  };
  h.after_backward = [this](int layer) {
    if (layer == -1) {
      ReduceBucket(emb_bucket_, emb_grads_.data());
      return;
    }
    const Bucket& b = buckets_[L(layer).bucket];
    if (layer == b.layers.lo) {  // its last layer is done
      ReduceBucket(b, block_grads_.data());
    }
  };
  return h;
}

float* ZeroState::LayerParams(int layer) {
  if (stage_ == 2) return full_params_.data() + L(layer).range.begin;
  return layer == -1 ? emb_params_.data() : block_params_.data();
}

float* ZeroState::LayerGrads(int layer) {
  if (layer == -1) return emb_grads_.data();
  return block_grads_.data() + L(layer).window_offset;
}

void ZeroState::ZeroGrad() {
  for (auto& l : layers_) l->grads_stale = true;
}

// The owned pieces no reduce reached since ZeroGrad, zeroed as they count.
void ZeroState::ZeroStaleGrads() {
  for (auto& l : layers_) {
    if (l->grads_stale) std::fill(l->grads.begin(), l->grads.end(), 0.0f);
    l->grads_stale = false;
  }
}

StatusOr<float> ZeroState::FinishGradients() {
  RETURN_IF_ERROR(status_);
  ZeroStaleGrads();
  const float scale = 1.0f / static_cast<float>(comm_->size());
  float partial = static_cast<float>(ScaleAndSquaredSum(own_grads_, scale));
  RETURN_IF_ERROR(comm_->AllReduceSum(&partial, 1));
  return std::sqrt(partial);
}

Status ZeroState::Update(const AdamParams& adam, float clip_scale,
                         const ParamsUpdated& updated, GatheredBy gather) {
  ZeroStaleGrads();
  float* p = Buffer(Which::kParams).data();
  DSL_CHECK(adam.grad_scale == 1.0f);  // the clip's scale goes there
  AdamParams scaled = adam;
  scaled.grad_scale = clip_scale;
  // Layer by layer: its AdamW, its gather, and then it is done (the same
  // bits as every AdamW and then every gather: the layers are apart).
  for (auto& l : layers_) {
    for (size_t i = l->runs_begin; i < l->runs_end; ++i) {
      const AdamRun& r = adam_runs_[i];
      AdamStep(p + r.param, own_grads_.data() + r.grad,
               own_m_.data() + r.moment, own_v_.data() + r.moment, r.count,
               scaled, r.decay);
    }
    RETURN_IF_ERROR(LayerUpdated(*l, updated, gather));
  }
  return Status::Ok();
}

Status ZeroState::GatherParams(const ParamsUpdated& updated) {
  for (auto& l : layers_)
    RETURN_IF_ERROR(LayerUpdated(*l, updated, GatheredBy::kThis));
  return Status::Ok();
}

Status ZeroState::LayerUpdated(Layer& l, const ParamsUpdated& updated,
                               GatheredBy gather) {
  if (gather == GatheredBy::kThis) RETURN_IF_ERROR(GatherLayer(l));
  if (!updated) return Status::Ok();
  if (stage_ == 2 && gather == GatheredBy::kTheDevice)
    return updated(l.range.begin + l.own_begin, l.own);
  if (stage_ == 2) return updated(l.range.begin, l.range.size());
  return updated(static_cast<size_t>(l.params.data() - own_params_.data()),
                 l.part.shard);
}

Status ZeroState::GatherLayer(Layer& l) {
  // One rank's pieces are its whole parameters, updated in place.
  if (stage_ != 2 || comm_->size() == 1) return Status::Ok();
  // Every rank takes every rank's updated piece of this layer.
  Copy({full_params_.data() + l.range.begin + l.own_begin, l.own},
       staging_.data());
  std::fill(staging_.begin() + l.own, staging_.begin() + l.part.shard, 0.0f);
  float* window =
      (&l == layers_.front().get() ? emb_grads_ : block_grads_).data();
  RETURN_IF_ERROR(comm_->AllGather(staging_.data(), window, l.part.shard));
  Copy({window, l.range.size()}, full_params_.data() + l.range.begin);
  return Status::Ok();
}

ZeroState::OwnedPiece ZeroState::owned_piece(int layer) const {
  const Layer& l = *layers_[layer + 1];
  const size_t at = static_cast<size_t>(l.grads.data() - own_grads_.data());
  return {at, l.part.shard, l.range.begin + l.own_begin, l.own};
}

std::vector<std::span<float>> ZeroState::buffers() {
  std::vector<std::span<float>> all;
  for (std::vector<float>* b :
       {&full_params_, &own_params_, &own_grads_, &own_m_, &own_v_,
        &emb_params_, &block_params_, &emb_grads_, &block_grads_}) {
    if (!b->empty()) all.emplace_back(*b);
  }
  return all;
}

std::span<float> ZeroState::Buffer(Which which) {
  switch (which) {
    case Which::kParams:
      return stage_ == 2 ? std::span(full_params_) : std::span(own_params_);
    case Which::kGrads:
      ZeroStaleGrads();
      return own_grads_;
    case Which::kM:
      return own_m_;
    case Which::kV:
      return own_v_;
  }
  return {};
}

int64_t ZeroState::state_bytes() const {
  return 4 * static_cast<int64_t>(full_params_.size() + own_params_.size() +
                                  own_grads_.size() + own_m_.size() +
                                  own_v_.size());
}

StatusOr<std::vector<float>> ZeroState::GatherAll(Which which) {
  if (which == Which::kParams && stage_ == 2) return full_params_;
  if (which == Which::kGrads) ZeroStaleGrads();
  std::vector<float> full(layout_.num_params());
  std::vector<float> window(std::max(emb_grads_.size(), block_grads_.size()));
  for (auto& l : layers_) {
    const std::span<const float> piece = which == Which::kParams  ? l->params
                                         : which == Which::kGrads ? l->grads
                                         : which == Which::kM     ? l->m
                                                                  : l->v;
    std::copy(piece.begin(), piece.begin() + l->own, staging_.begin());
    std::fill(staging_.begin() + l->own, staging_.begin() + l->part.shard,
              0.0f);
    RETURN_IF_ERROR(
        comm_->AllGather(staging_.data(), window.data(), l->part.shard));
    std::copy(window.begin(), window.begin() + l->range.size(),
              full.begin() + l->range.begin);
  }
  return full;
}

void ZeroState::LoadState(std::span<const float> params,
                          std::span<const float> m, std::span<const float> v) {
  LoadParams(params);
  for (auto& l : layers_) {
    const size_t b = l->range.begin + l->own_begin;
    std::copy(m.begin() + b, m.begin() + b + l->own, l->m.begin());
    std::copy(v.begin() + b, v.begin() + b + l->own, l->v.begin());
  }
}

StatusOr<RankShard> ZeroState::CheckpointRange(size_t begin, size_t count) {
  const ParamLayout llmc(layout_.config(), ParamOrder::kLlmc);
  whole_.clear();
  for (Which which : {Which::kParams, Which::kM, Which::kV}) {
    ASSIGN_OR_RETURN(std::vector<float> full, GatherAll(which));
    whole_.push_back(Reorder(layout_, full, llmc));
  }
  RankShard shard;
  shard.begin = begin;
  shard.params = std::span<const float>(whole_[0].data() + begin, count);
  shard.m = std::span<const float>(whole_[1].data() + begin, count);
  shard.v = std::span<const float>(whole_[2].data() + begin, count);
  return shard;
}

Status ZeroState::Resume(const std::string& dir) {
  const ParamLayout llmc(layout_.config(), ParamOrder::kLlmc);
  std::vector<std::vector<float>> parts;
  for (const char* which : {"params", "m", "v"}) {
    std::vector<float> full(layout_.num_params());
    RETURN_IF_ERROR(ReadCheckpointRange(dir, which, 0, full));
    parts.push_back(Reorder(llmc, full, layout_));
  }
  LoadState(parts[0], parts[1], parts[2]);
  return Status::Ok();
}

StatusOr<std::vector<float>> ZeroState::WholeParams() {
  ASSIGN_OR_RETURN(std::vector<float> full, GatherAll(Which::kParams));
  return Reorder(layout_, full,
                 ParamLayout(layout_.config(), ParamOrder::kLlmc));
}

}  // namespace dslaunch::worker
