// libFuzzer target: the hostfile parser with SLURM-style range expansion
// (`node[01-04,07]`, `r[1-2]n[1-2]`) and the --include/--exclude host-list
// parser, then the plan built from both; and SLURM's host lists and
// SLURM_TASKS_PER_NODE. The input is hostfile text; comment lines of the form
// `#include SPEC`, `#exclude SPEC`, `#num_nodes N`, `#num_gpus N` (ignored by
// the hostfile parser) supply the plan options, `#nodelist LIST` and
// `#tasks_per_node TEXT` a SLURM_JOB_NODELIST and SLURM_TASKS_PER_NODE.
// Checks the invariants the launcher relies on. Single-threaded, called by
// libFuzzer's driver.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>

#include "launcher/plan/hostfile.h"
#include "launcher/plan/plan.h"
#include "launcher/plan/slurm_allocation.h"

namespace {

using dslaunch::launcher::Hostfile;
using dslaunch::launcher::PlanOptions;

void Require(bool condition, const char* what) {
  if (!condition) {
    std::fprintf(stderr, "invariant broken: %s\n", what);
    std::abort();
  }
}

struct SlurmInput {
  std::optional<std::string> nodelist, tasks_per_node;
};

// Reads `#key value` option lines; a number that does not parse stays -1.
PlanOptions OptionsFrom(std::string_view text, SlurmInput* slurm) {
  PlanOptions options;
  while (!text.empty()) {
    const size_t newline = text.find('\n');
    std::string_view line = text.substr(0, newline);
    text.remove_prefix(newline == std::string_view::npos ? text.size()
                                                         : newline + 1);
    auto value = [&line](std::string_view key) -> std::optional<std::string> {
      if (line.substr(0, key.size()) != key) return std::nullopt;
      return std::string(line.substr(key.size()));
    };
    if (auto v = value("#include ")) options.include = *v;
    if (auto v = value("#exclude ")) options.exclude = *v;
    if (auto v = value("#num_nodes "))
      options.num_nodes = std::atoi(v->c_str());
    if (auto v = value("#num_gpus ")) options.num_gpus = std::atoi(v->c_str());
    if (auto v = value("#nodelist ")) slurm->nodelist = *v;
    if (auto v = value("#tasks_per_node ")) slurm->tasks_per_node = *v;
  }
  return options;
}

void CheckHostfile(const Hostfile& hostfile) {
  Require(!hostfile.hosts.empty(), "a parsed hostfile has hosts");
  for (const auto& entry : hostfile.hosts) {
    Require(!entry.host.empty() && entry.host.size() <= 253,
            "host name length");
    Require(entry.host.find_first_of("[] \t=#") == std::string::npos,
            "host name has no syntax characters");
    Require(entry.slots >= 1, "slots >= 1");
    Require(!entry.max_slots || *entry.max_slots >= entry.slots, "max_slots");
    Require(!entry.port || (*entry.port >= 1 && *entry.port <= 65535), "port");
    Require(entry.line >= 1, "line is 1-based");
  }
}

void CheckPlan(const dslaunch::launcher::Plan& plan) {
  int next_rank = 0;
  for (size_t i = 0; i < plan.nodes.size(); ++i) {
    const auto& node = plan.nodes[i];
    Require(node.node_rank == static_cast<int>(i), "node ranks in order");
    Require(node.first_rank == next_rank, "ranks assigned in blocks");
    Require(!node.slots.empty(), "a planned node has slots");
    next_rank += static_cast<int>(node.slots.size());
  }
  Require(plan.world_size == next_rank, "world size is the sum of slots");
}

void CheckSlurm(const SlurmInput& in) {
  if (!in.nodelist) return;
  auto hosts = dslaunch::launcher::ExpandHostlist(*in.nodelist);
  if (!hosts.ok()) {
    Require(hosts.status().code() == dslaunch::StatusCode::kDataError,
            "host list errors are data errors");
    return;
  }
  Require(!hosts->empty(), "an accepted host list has hosts");
  Require(hosts->size() <= static_cast<size_t>(dslaunch::launcher::kMaxHosts),
          "a host list is within the host limit");
  for (const auto& host : *hosts) {
    Require(!host.empty() && host.find_first_of("[], \t") == std::string::npos,
            "expanded names have no syntax characters");
  }
  if (!in.tasks_per_node) return;
  auto counts =
      dslaunch::launcher::ParseTasksPerNode(*in.tasks_per_node, hosts->size());
  if (!counts.ok()) {
    Require(counts.status().message().rfind("SLURM_TASKS_PER_NODE", 0) == 0,
            "tasks-per-node errors name the variable");
    return;
  }
  Require(counts->size() == hosts->size(), "one count per node");
  for (int c : *counts) {
    Require(c >= 1 && c <= dslaunch::launcher::kMaxSlotsPerHost,
            "counts within the slot limit");
  }
}

int64_t TotalSlots(const Hostfile& hostfile) {
  int64_t total = 0;
  for (const auto& entry : hostfile.hosts) total += entry.slots;
  return total;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  SlurmInput slurm;
  const PlanOptions options = OptionsFrom(text, &slurm);
  CheckSlurm(slurm);
  for (const std::string* spec : {&options.include, &options.exclude}) {
    auto terms = dslaunch::launcher::ParseFilterSpec(*spec, "--include");
    if (!terms.ok()) {
      Require(terms.status().message().rfind("--include", 0) == 0,
              "filter errors name the flag");
    }
  }
  auto hostfile = dslaunch::launcher::ParseHostfile(text, "hosts");
  if (!hostfile.ok()) {
    Require(hostfile.status().message().rfind("hosts:", 0) == 0,
            "hostfile errors start with path:");
    return 0;
  }
  CheckHostfile(*hostfile);
  Require(TotalSlots(*hostfile) <= dslaunch::launcher::kMaxTotalSlots,
          "an accepted hostfile is within the slot limit");
  auto plan = dslaunch::launcher::MakePlan(*hostfile, options);
  if (plan.ok()) CheckPlan(*plan);
  return 0;
}
