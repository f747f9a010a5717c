#include "launcher/supervise/generations.h"

#include <spdlog/spdlog.h>

#include <chrono>
#include <cstdio>

#include "launcher/supervise/restarts.h"  // RestartName

namespace dslaunch::launcher {

Generations::Generations(const LaunchOptions& options, Console& console,
                         JobState& state, KvStore& store, JobWatch& watch,
                         Plan plan, JobSpecParts spec)
    : options_(options),
      console_(console),
      state_(state),
      store_(store),
      watch_(watch),
      plan_(std::move(plan)),
      spec_(std::move(spec)) {}

void Generations::SendJobSpec(int agent) const {
  for (const NodePlan& node : plan_.nodes) {
    if (node.agent != agent) continue;
    wire::Envelope env;
    *env.mutable_job_spec() = MakeJobSpec(plan_, spec_, node.node_rank);
    (void)links_->Send(agent, env);
    return;
  }
}

void Generations::StandBy(int agent) const {
  wire::Envelope env;
  env.mutable_abort()->set_reason(
      "no place in this generation; standing by for a later one");
  env.mutable_abort()->set_restart(true);
  (void)links_->Send(agent, env);
}

// The start mode starts the next generation's agents once every agent that
// ran this one (mpirun's) has ended.
void Generations::Retire(int agent) const {
  spdlog::info("agent of node {} ran its generation; it ends", agent);
  wire::Envelope env;
  env.mutable_shutdown();
  (void)links_->Send(agent, env);
}

void Generations::StartNext(const std::vector<int>& agents, const Plan& pool,
                            bool join, int node0_free_port) {
  const Outcome ended = state_.outcome();
  const double stopped_s =
      std::chrono::duration<double>(Clock::now() - state_.stop_time()).count();
  const int node0 = agents.at(0);
  std::string master_addr = plan_.master_addr;
  if (options_.plan.master_addr.empty() &&
      (plan_.nodes.empty() || plan_.nodes[0].agent != node0 || join)) {
    master_addr = join ? state_.node(node0).address : pool.nodes[node0].host;
  }
  int master_port = plan_.master_port;
  if (!options_.master_port_given && node0_free_port > 0)
    master_port = node0_free_port;
  std::vector<int> agents_before;
  for (const NodePlan& node : plan_.nodes) agents_before.push_back(node.agent);
  const int world_before = plan_.world_size;
  Plan next = GenerationPlan(pool, agents, master_addr, master_port);
  store_.Clear("the generation ended");
  state_.NextGeneration(next);
  plan_ = std::move(next);
  watch_.NewGeneration();
  spec_.restart_count = state_.restarts();
  console_.NewGeneration(plan_, state_.restarts(), ended.reason,
                         CauseName(ended.cause));
  char took[32];
  std::snprintf(took, sizeof(took), "%.2f", stopped_s);
  std::string size;  // where it runs, when that changed
  if (agents != agents_before) {
    std::string hosts;
    for (const NodePlan& node : plan_.nodes)
      hosts += (hosts.empty() ? "" : ", ") + node.host;
    size = "; on " + Plural(plan_.nodes.size(), "node") + " (" + hosts + "), " +
           Plural(plan_.world_size, "rank") +
           (plan_.world_size != world_before
                ? " (was " + std::to_string(world_before) + ")"
                : "");
  }
  console_.Note(RestartName(state_, ended.cause == Outcome::Cause::kGrow, 0) +
                " (" + took + " s after the stop began): " + ended.reason +
                size + "; MASTER_PORT " + std::to_string(plan_.master_port));
  for (const NodePlan& node : plan_.nodes) SendJobSpec(node.agent);
}

}  // namespace dslaunch::launcher
