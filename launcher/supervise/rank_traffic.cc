#include "launcher/supervise/rank_traffic.h"

#include <spdlog/spdlog.h>

namespace dslaunch::launcher {

bool RankTraffic::OfNode(int rank, int node) const {
  auto it = state_.ranks().find(rank);
  if (it != state_.ranks().end() && it->second.node_rank == node) return true;
  spdlog::warn("node {}: output or progress of rank {}, not one of its own",
               node, rank);
  return false;
}

void RankTraffic::Progress(int node, const wire::ProgressBatch& batch) {
  for (const auto& r : batch.records()) {
    if (OfNode(r.rank(), node)) console_.Progress(r.rank(), r.json(), r.time());
  }
  for (const auto& [rank, count] : batch.malformed()) {
    if (OfNode(rank, node)) malformed_[rank] += count;
  }
  for (const auto& [rank, count] : batch.dropped()) {
    if (OfNode(rank, node)) dropped_[rank] += count;
  }
}

bool RankTraffic::Route(int node, const wire::Envelope& msg) {
  switch (msg.msg_case()) {
    case wire::Envelope::kLogBatch:
      for (const auto& e : msg.log_batch().entries()) {
        if (!OfNode(e.rank(), node)) continue;
        console_.Line(e.rank(), e.stream() == wire::LogBatch::STDERR, e.line(),
                      e.partial());
      }
      console_.Flush();
      return true;
    case wire::Envelope::kProgressBatch:
      Progress(node, msg.progress_batch());
      return true;
    case wire::Envelope::kRankStats:
      for (const auto& e : msg.rank_stats().entries()) {
        if (OfNode(e.rank(), node))
          console_.board().Stats(e.rank(), e.rss_bytes());
      }
      return true;
    case wire::Envelope::kStacks:
      if (OfNode(msg.stacks().rank(), node)) forensics_.OnStacks(msg.stacks());
      return true;
    default:
      return false;
  }
}

}  // namespace dslaunch::launcher
