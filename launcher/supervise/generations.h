// Generations: the plan the current generation runs and what each agent
// hears of it. It holds the plan and the parts every JobSpec shares, sends
// an agent its JobSpec, tells one to stand by for a later generation or
// (agents that run one generation each, mpirun's) to end, and starts the
// next generation when a restart is due: node ranks and ranks renumbered
// densely on the agents chosen, MASTER_ADDR node 0's (unless
// --master_addr), a MASTER_PORT node 0 found free (unless --master_port),
// an empty store, the restart count in every rank's environment, and the
// console told. Owned by the Job; io_context thread only.
#pragma once

#include <vector>

#include "launcher/options.h"
#include "launcher/plan/job_spec.h"
#include "launcher/plan/plan.h"
#include "launcher/report/console.h"
#include "launcher/state/job_state.h"
#include "launcher/supervise/control_server.h"  // AgentLinks
#include "launcher/supervise/job_watch.h"
#include "launcher/supervise/kv_store.h"

namespace dslaunch::launcher {

class Generations {
 public:
  Generations(const LaunchOptions& options, Console& console, JobState& state,
              KvStore& store, JobWatch& watch, Plan plan, JobSpecParts spec);

  void SetLinks(AgentLinks* links) { links_ = links; }
  const Plan& plan() const { return plan_; }
  Plan& mutable_plan() { return plan_; }
  const JobSpecParts& spec() const { return spec_; }

  // The agent's part of the current generation, when it has one.
  void SendJobSpec(int agent) const;
  // No place for it in this generation: it waits for a later one.
  void StandBy(int agent) const;
  // It ran its one generation: it ends.
  void Retire(int agent) const;
  // The next generation on `agents` (ascending, indices into `pool`); under
  // join node 0's address is its agent's; `node0_free_port` is the port node
  // 0 last found free (0: none). Only when state.ReadyToRestart().
  void StartNext(const std::vector<int>& agents, const Plan& pool, bool join,
                 int node0_free_port);

 private:
  const LaunchOptions& options_;
  Console& console_;
  JobState& state_;
  KvStore& store_;
  JobWatch& watch_;
  AgentLinks* links_ = nullptr;
  Plan plan_;
  JobSpecParts spec_;  // what every node's JobSpec shares
};

}  // namespace dslaunch::launcher
