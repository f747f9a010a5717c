// RankTraffic: what an agent sends about its ranks (output lines, progress
// records, memory, stacks) reaches the console and the forensics only for a
// rank that runs on that agent's node in this generation; an entry for any
// other rank is dropped and logged (an agent speaks for its own ranks only).
// It also counts the progress records each rank's agent found malformed or
// dropped (too fast), for the closing report. Owned by the Job; io_context
// thread only.
#pragma once

#include <cstdint>
#include <map>

#include "launcher/report/console.h"
#include "launcher/state/job_state.h"
#include "launcher/supervise/job_forensics.h"
#include "proto/dslaunch.pb.h"

namespace dslaunch::launcher {

class RankTraffic {
 public:
  RankTraffic(const JobState& state, Console& console, JobForensics& forensics)
      : state_(state), console_(console), forensics_(forensics) {}

  // Takes `msg` from node `node` if it is one of those messages (true).
  bool Route(int node, const wire::Envelope& msg);

  // rank -> progress records its agent found malformed / dropped.
  const std::map<int, int64_t>& malformed() const { return malformed_; }
  const std::map<int, int64_t>& dropped() const { return dropped_; }

 private:
  bool OfNode(int rank, int node) const;
  void Progress(int node, const wire::ProgressBatch& batch);

  const JobState& state_;
  Console& console_;
  JobForensics& forensics_;
  std::map<int, int64_t> malformed_, dropped_;
};

}  // namespace dslaunch::launcher
