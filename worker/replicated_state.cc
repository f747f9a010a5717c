#include "worker/replicated_state.h"

#include <algorithm>
#include <cmath>

#include "worker/flat_math.h"
#include "worker/partition.h"

namespace dslaunch::worker {

ReplicatedState::ReplicatedState(Model* model, int stage, Comm* comm)
    : model_(model), stage_(stage), comm_(comm) {
  const size_t n = model_->layout().num_params();
  const Partition part = MakePartition(n, comm_->size());
  model_->PadFlatBuffers(part.padded());
  shard_begin_ = stage_ == 0 ? 0 : part.begin(comm_->rank());
  shard_size_ = stage_ == 0 ? n : part.shard;
  m_.assign(shard_size_, 0.0f);
  v_.assign(shard_size_, 0.0f);
}

size_t ReplicatedState::shard_real() const {
  const size_t n = model_->layout().num_params();
  return shard_begin_ >= n ? 0 : std::min(shard_size_, n - shard_begin_);
}

StatusOr<float> ReplicatedState::FinishGradients() {
  const int world = comm_->size();
  float* g = model_->grads().data();
  if (world > 1) {
    if (stage_ == 0) {
      RETURN_IF_ERROR(comm_->AllReduceSum(g, model_->layout().num_params()));
    } else {
      // Only this rank's piece of the reduced gradients is needed.
      RETURN_IF_ERROR(
          comm_->ReduceScatterSum(g, g + shard_begin_, shard_size_));
    }
  }
  // Averaged, and the norm of the gradients this rank updates (stage 1: its
  // piece's real part, summed over ranks).
  const size_t n = stage_ == 0 ? model_->layout().num_params() : shard_real();
  double sum = ScaleAndSquaredSum({g + shard_begin_, n},
                                  1.0f / static_cast<float>(world));
  if (stage_ > 0 && world > 1) {
    float partial = static_cast<float>(sum);
    RETURN_IF_ERROR(comm_->AllReduceSum(&partial, 1));
    sum = partial;
  }
  return static_cast<float>(std::sqrt(sum));
}

Status ReplicatedState::Update(const AdamParams& adam, float clip_scale) {
  RETURN_IF_ERROR(Step(adam, clip_scale));
  return GatherParams();
}

Status ReplicatedState::Step(const AdamParams& adam, float clip_scale,
                             const ParamsUpdated& updated) {
  float* p = model_->params().data();
  const float* g = model_->grads().data();
  DSL_CHECK(adam.grad_scale == 1.0f);  // the clip's scale goes there
  AdamParams scaled = adam;
  scaled.grad_scale = clip_scale;
  const size_t lo = shard_begin_, hi = shard_begin_ + shard_size_;
  for (const DecaySegment& seg : model_->layout().DecaySegments()) {
    const size_t b = std::max(lo, seg.range.begin),
                 e = std::min(hi, seg.range.end);
    if (b >= e) continue;
    // In pieces when someone takes them as they are done (elementwise: the
    // same bits as one call).
    const size_t piece = updated ? kUpdatedFloats : e - b;
    for (size_t at = b; at < e; at += piece) {
      const size_t n = std::min(piece, e - at);
      AdamStep(p + at, g + at, m_.data() + (at - lo), v_.data() + (at - lo), n,
               scaled, seg.decay);
      if (updated) RETURN_IF_ERROR(updated(at, n));
    }
  }
  return Status::Ok();
}

Status ReplicatedState::GatherParams() {
  if (stage_ == 0 || comm_->size() == 1) return Status::Ok();
  float* p = model_->params().data();
  gather_in_.assign(p + shard_begin_, p + shard_begin_ + shard_size_);
  return comm_->AllGather(gather_in_.data(), p, shard_size_);
}

RankShard ReplicatedState::CheckpointRange(size_t begin, size_t count) const {
  // The moments this rank holds start at shard_begin_ (0 for stage 0); a
  // checkpoint's partition is this rank's stage-1 shard.
  RankShard shard;
  shard.begin = begin;
  const size_t m_off = begin - shard_begin_;
  shard.params = std::span<const float>(model_->params().data() + begin, count);
  shard.m = std::span<const float>(m_.data() + m_off, count);
  shard.v = std::span<const float>(v_.data() + m_off, count);
  return shard;
}

Status ReplicatedState::Resume(const std::string& dir) {
  const size_t n = model_->layout().num_params();
  RETURN_IF_ERROR(
      ReadCheckpointRange(dir, "params", 0, model_->params().first(n)));
  const size_t real = shard_real();
  std::fill(m_.begin(), m_.end(), 0.0f);
  std::fill(v_.begin(), v_.end(), 0.0f);
  RETURN_IF_ERROR(
      ReadCheckpointRange(dir, "m", shard_begin_, std::span(m_).first(real)));
  return ReadCheckpointRange(dir, "v", shard_begin_, std::span(v_).first(real));
}

int64_t ReplicatedState::moment_bytes() const {
  return 4 * static_cast<int64_t>(m_.size() + v_.size());
}

}  // namespace dslaunch::worker
