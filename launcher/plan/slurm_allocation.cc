#include "launcher/plan/slurm_allocation.h"

#include <charconv>
#include <optional>

namespace dslaunch::launcher {

namespace {

// A positive count below `max`, or nullopt.
std::optional<int> Count(std::string_view s, int max) {
  int value = 0;
  auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), value);
  if (ec != std::errc() || end != s.data() + s.size() || value < 1 ||
      value > max)
    return std::nullopt;
  return value;
}

std::string NodeList(const EnvLookup& env) {
  std::string list = env("SLURM_JOB_NODELIST");
  return list.empty() ? env("SLURM_NODELIST") : list;
}

}  // namespace

bool InSlurmAllocation(const EnvLookup& env) {
  return !env("SLURM_JOB_ID").empty() && !NodeList(env).empty();
}

StatusOr<std::vector<int>> ParseTasksPerNode(std::string_view text,
                                             size_t nodes) {
  const std::string bad = "SLURM_TASKS_PER_NODE '" + std::string(text) + "'";
  std::vector<int> counts;
  while (true) {
    const size_t comma = text.find(',');
    std::string_view item = text.substr(0, comma);
    int repeat = 1;
    if (const size_t paren = item.find("(x"); paren != std::string_view::npos) {
      if (item.back() != ')') return DataError(bad + ": expected N or N(xM)");
      auto times =
          Count(item.substr(paren + 2, item.size() - paren - 3), kMaxHosts);
      if (!times) return DataError(bad + ": expected N or N(xM)");
      repeat = *times;
      item = item.substr(0, paren);
    }
    auto count = Count(item, kMaxSlotsPerHost);
    if (!count) return DataError(bad + ": expected N or N(xM)");
    if (counts.size() + static_cast<size_t>(repeat) > nodes)
      return DataError(bad + ": more entries than the " +
                       std::to_string(nodes) + " nodes of the allocation");
    counts.insert(counts.end(), static_cast<size_t>(repeat), *count);
    if (comma == std::string_view::npos) break;
    text.remove_prefix(comma + 1);
  }
  if (counts.size() != nodes)
    return DataError(bad + ": " + std::to_string(counts.size()) +
                     " entries for the " + std::to_string(nodes) +
                     " nodes of the allocation");
  return counts;
}

StatusOr<SlurmAllocation> ReadSlurmAllocation(const EnvLookup& env,
                                              int num_gpus) {
  SlurmAllocation a;
  a.job_id = env("SLURM_JOB_ID");
  const std::string list = NodeList(env);
  if (a.job_id.empty() || list.empty()) {
    return NotFound(
        "not inside a SLURM allocation (SLURM_JOB_ID and SLURM_JOB_NODELIST "
        "are not set): run under salloc or sbatch, or give a --hostfile");
  }
  auto nodes = ExpandHostlist(list);
  if (!nodes.ok())
    return DataError("SLURM_JOB_NODELIST: " + nodes.status().message());
  a.nodes = std::move(nodes).value();
  const size_t n = a.nodes.size();
  if (num_gpus > 0) {
    a.slots.assign(n, num_gpus);
    a.slots_from = "--num_gpus";
  } else if (const std::string gpus = env("SLURM_GPUS_ON_NODE");
             !gpus.empty()) {
    auto count = Count(gpus, kMaxSlotsPerHost);
    if (!count) {
      return DataError("SLURM_GPUS_ON_NODE '" + gpus +
                       "' is not a count of GPUs in 1.." +
                       std::to_string(kMaxSlotsPerHost));
    }
    a.slots.assign(n, *count);
    a.slots_from = "SLURM_GPUS_ON_NODE";
  } else if (const std::string tasks = env("SLURM_TASKS_PER_NODE");
             !tasks.empty()) {
    ASSIGN_OR_RETURN(a.slots, ParseTasksPerNode(tasks, n));
    a.slots_from = "SLURM_TASKS_PER_NODE";
  } else {
    a.slots.assign(n, 1);
    a.slots_from = "";  // none of them
  }
  return a;
}

Hostfile AllocationHostfile(const SlurmAllocation& a) {
  Hostfile h;
  h.path = "SLURM_JOB_NODELIST";
  for (size_t i = 0; i < a.nodes.size(); ++i) {
    HostEntry e;
    e.host = a.nodes[i];
    e.slots = a.slots[i];
    e.line = 1;
    h.hosts.push_back(std::move(e));
  }
  return h;
}

std::string DescribeAllocation(const SlurmAllocation& a) {
  std::string slots;
  bool same = true;
  for (int s : a.slots) same &= s == a.slots.front();
  if (same && !a.slots.empty()) {
    slots = std::to_string(a.slots.front()) + " per node";
  } else {
    for (size_t i = 0; i < a.slots.size(); ++i)
      slots += (i ? "," : "") + std::to_string(a.slots[i]);
  }
  const size_t n = a.nodes.size();
  return "SLURM job " + a.job_id + ": " + std::to_string(n) +
         (n == 1 ? " node" : " nodes") + " from SLURM_JOB_NODELIST, ranks " +
         slots +
         (a.slots_from.empty()
              ? " (no --num_gpus, SLURM_GPUS_ON_NODE or SLURM_TASKS_PER_NODE)"
              : " from " + a.slots_from);
}

}  // namespace dslaunch::launcher
