#include "launcher/plan/plan.h"

#include <algorithm>      // find, max, sort
#include <charconv>       // from_chars
#include <unordered_map>  // host lookup
#include <unordered_set>  // names seen in a spec

#include "base/host_info.h"  // JoinHostPort

namespace dslaunch::launcher {
namespace {

std::string Prefix(std::string_view flag) { return std::string(flag) + ": "; }

std::optional<int> ParseSlotId(std::string_view s) {
  int value = 0;
  if (s.empty() ||
      s.find_first_not_of("0123456789") != std::string_view::npos) {
    return std::nullopt;
  }
  auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), value);
  if (ec != std::errc() || end != s.data() + s.size()) return std::nullopt;
  return value;
}

// Splits on `sep`, keeping empty parts.
std::vector<std::string_view> Split(std::string_view s, char sep) {
  std::vector<std::string_view> parts;
  while (true) {
    size_t pos = s.find(sep);
    parts.push_back(s.substr(0, pos));
    if (pos == std::string_view::npos) return parts;
    s.remove_prefix(pos + 1);
  }
}

StatusOr<FilterTerm> ParseTerm(std::string_view term, std::string_view spec,
                               std::string_view flag) {
  size_t colon = term.find(':');
  FilterTerm result{std::string(term.substr(0, colon)), {}};
  if (result.host.empty()) {
    return InvalidArgument(Prefix(flag) + "empty host name in " + Quoted(spec));
  }
  if (colon == std::string_view::npos) return result;
  std::string_view slots = term.substr(colon + 1);
  if (slots.empty()) {
    return InvalidArgument(Prefix(flag) + "no slot ids after ':' in " +
                           Quoted(term));
  }
  for (std::string_view text : Split(slots, ',')) {
    std::optional<int> slot = ParseSlotId(text);
    if (!slot) {
      return InvalidArgument(Prefix(flag) + Quoted(text) + " in " +
                             Quoted(term) + " is not a slot id");
    }
    if (std::find(result.slots.begin(), result.slots.end(), *slot) !=
        result.slots.end()) {
      return InvalidArgument(Prefix(flag) + "slot " + std::to_string(*slot) +
                             " is given twice in " + Quoted(term));
    }
    result.slots.push_back(*slot);
  }
  return result;
}

Status ValidateOptions(const PlanOptions& options) {
  if (!options.include.empty() && !options.exclude.empty()) {
    return InvalidArgument("--include and --exclude are mutually exclusive");
  }
  if (options.num_nodes != -1 && options.num_nodes < 1) {
    return InvalidArgument("--num_nodes must be at least 1, got " +
                           std::to_string(options.num_nodes));
  }
  if (options.num_gpus != -1 &&
      (options.num_gpus < 1 || options.num_gpus > kMaxSlotsPerHost)) {
    return InvalidArgument("--num_gpus must be in 1.." +
                           std::to_string(kMaxSlotsPerHost) + ", got " +
                           std::to_string(options.num_gpus));
  }
  if (options.master_port < 1 || options.master_port > 65535) {
    return InvalidArgument("--master_port must be in 1..65535, got " +
                           std::to_string(options.master_port));
  }
  return Status::Ok();
}

// The hostfile limits (hostfile.h), checked again for a Hostfile that did not
// come from the parser, before any per-slot allocation.
Status CheckLimits(const Hostfile& hostfile) {
  if (hostfile.hosts.size() > static_cast<size_t>(kMaxHosts)) {
    return DataError("more than " + std::to_string(kMaxHosts) + " hosts");
  }
  long total = 0;
  for (const HostEntry& host : hostfile.hosts) {
    if (host.slots < 1 || host.slots > kMaxSlotsPerHost) {
      return DataError("host " + host.host + ": slots must be in 1.." +
                       std::to_string(kMaxSlotsPerHost));
    }
    total += host.slots;
  }
  if (total > kMaxTotalSlots) {
    return DataError("more than " + std::to_string(kMaxTotalSlots) + " slots");
  }
  return Status::Ok();
}

// selection[i]: the selected slot ids of hostfile.hosts[i], ascending.
using Selection = std::vector<std::vector<int>>;

std::vector<int> AllSlots(const HostEntry& host) {
  std::vector<int> slots;
  for (int i = 0; i < host.slots; ++i) slots.push_back(i);
  return slots;
}

// Resolves each term to its host's index in the hostfile, checking that the
// host exists and the slot ids are on it.
StatusOr<std::vector<size_t>> ResolveTerms(const Hostfile& hostfile,
                                           const std::vector<FilterTerm>& terms,
                                           std::string_view flag) {
  std::unordered_map<std::string, size_t> index;
  for (size_t i = 0; i < hostfile.hosts.size(); ++i)
    index[HostKey(hostfile.hosts[i].host)] = i;
  std::vector<size_t> resolved;
  for (const FilterTerm& term : terms) {
    auto it = index.find(HostKey(term.host));
    if (it == index.end()) {
      std::string where = hostfile.path.empty() ? "" : " " + hostfile.path;
      return InvalidArgument(Prefix(flag) + "host " + term.host +
                             " is not in the hostfile" + where);
    }
    const HostEntry& host = hostfile.hosts[it->second];
    for (int slot : term.slots) {
      if (slot >= host.slots) {
        std::string has = host.slots == 1
                              ? "only slot 0"
                              : "slots 0-" + std::to_string(host.slots - 1);
        return InvalidArgument(Prefix(flag) + "slot " + std::to_string(slot) +
                               " is not on host " + host.host + " (it has " +
                               has + ")");
      }
    }
    resolved.push_back(it->second);
  }
  return resolved;
}

// Applies --include or --exclude (whichever is set) to every host's slots.
StatusOr<Selection> SelectSlots(const Hostfile& hostfile,
                                const PlanOptions& options) {
  Selection selection;
  for (const HostEntry& host : hostfile.hosts)
    selection.push_back(AllSlots(host));
  bool include = !options.include.empty();
  if (!include && options.exclude.empty()) return selection;
  std::string_view flag = include ? "--include" : "--exclude";
  ASSIGN_OR_RETURN(
      std::vector<FilterTerm> terms,
      ParseFilterSpec(include ? options.include : options.exclude, flag));
  ASSIGN_OR_RETURN(std::vector<size_t> hosts,
                   ResolveTerms(hostfile, terms, flag));
  if (include) selection.assign(hostfile.hosts.size(), {});
  for (size_t t = 0; t < terms.size(); ++t) {
    std::vector<int>& slots = selection[hosts[t]];
    const HostEntry& host = hostfile.hosts[hosts[t]];
    std::vector<int> named =
        terms[t].slots.empty() ? AllSlots(host) : terms[t].slots;
    if (include) {
      slots = named;
      std::sort(slots.begin(), slots.end());
    } else {
      std::erase_if(slots, [&](int s) {
        return std::find(named.begin(), named.end(), s) != named.end();
      });
    }
  }
  return selection;
}

// Turns the selection into nodes (hosts left with no slots are dropped) and
// applies --num_nodes and --num_gpus.
StatusOr<std::vector<NodePlan>> MakeNodes(const Hostfile& hostfile,
                                          const Selection& selection,
                                          const PlanOptions& options) {
  std::vector<NodePlan> nodes;
  for (size_t i = 0; i < hostfile.hosts.size(); ++i) {
    if (selection[i].empty()) continue;
    const HostEntry& host = hostfile.hosts[i];
    nodes.push_back({0, host.host, selection[i], 0, host.port, host.user});
  }
  if (nodes.empty()) {
    std::string after =
        options.exclude.empty() ? "" : " after --exclude " + options.exclude;
    return InvalidArgument("no slots left to run on" + after);
  }
  if (options.min_nodes != -1) {
    // MIN:MAX: up to MAX nodes, the rest spares (split off by MakePlan).
    if (nodes.size() < static_cast<size_t>(options.min_nodes)) {
      return InvalidArgument(
          "--num_nodes " + std::to_string(options.min_nodes) + ":" +
          std::to_string(options.num_nodes) + ": only " +
          std::to_string(nodes.size()) + " hosts are selected");
    }
  } else if (options.num_nodes != -1) {
    if (nodes.size() < static_cast<size_t>(options.num_nodes)) {
      return InvalidArgument(
          "--num_nodes " + std::to_string(options.num_nodes) + ": only " +
          std::to_string(nodes.size()) + " hosts are selected");
    }
    nodes.resize(static_cast<size_t>(options.num_nodes));
  }
  if (options.num_gpus == -1) return nodes;
  for (NodePlan& node : nodes) {
    if (node.slots.size() < static_cast<size_t>(options.num_gpus)) {
      return InvalidArgument("--num_gpus " + std::to_string(options.num_gpus) +
                             ": host " + node.host + " has only " +
                             std::to_string(node.slots.size()) +
                             " selected slots");
    }
    node.slots.resize(static_cast<size_t>(options.num_gpus));
  }
  return nodes;
}

std::string PadRight(const std::string& s, size_t width) {
  return s.size() >= width ? s : s + std::string(width - s.size(), ' ');
}

}  // namespace

std::string Plural(size_t n, const std::string& noun) {
  return std::to_string(n) + " " + noun + (n == 1 ? "" : "s");
}

StatusOr<std::vector<FilterTerm>> ParseFilterSpec(std::string_view spec,
                                                  std::string_view flag) {
  if (spec.empty()) return InvalidArgument(Prefix(flag) + "empty spec");
  std::vector<FilterTerm> terms;
  std::unordered_set<std::string> seen;
  for (std::string_view part : Split(spec, '@')) {
    ASSIGN_OR_RETURN(FilterTerm term, ParseTerm(part, spec, flag));
    if (!seen.insert(HostKey(term.host)).second) {
      return InvalidArgument(Prefix(flag) + "host " + term.host +
                             " is named twice in " + Quoted(spec));
    }
    terms.push_back(std::move(term));
  }
  return terms;
}

StatusOr<Plan> MakePlan(const Hostfile& hostfile, const PlanOptions& options) {
  RETURN_IF_ERROR(ValidateOptions(options));
  if (hostfile.hosts.empty()) return InvalidArgument("no hosts to run on");
  RETURN_IF_ERROR(CheckLimits(hostfile));
  ASSIGN_OR_RETURN(Selection selection, SelectSlots(hostfile, options));
  Plan plan;
  ASSIGN_OR_RETURN(plan.nodes, MakeNodes(hostfile, selection, options));
  if (options.min_nodes != -1 &&
      plan.nodes.size() > static_cast<size_t>(options.num_nodes)) {
    plan.spares.assign(plan.nodes.begin() + options.num_nodes,
                       plan.nodes.end());
    plan.nodes.resize(static_cast<size_t>(options.num_nodes));
  }
  for (size_t i = 0; i < plan.nodes.size(); ++i) {
    plan.nodes[i].node_rank = plan.nodes[i].agent = static_cast<int>(i);
    plan.nodes[i].first_rank = plan.world_size;
    plan.world_size += static_cast<int>(plan.nodes[i].slots.size());
  }
  for (size_t i = 0; i < plan.spares.size(); ++i) {
    plan.spares[i].agent = static_cast<int>(plan.nodes.size() + i);
    plan.spares[i].node_rank = plan.spares[i].first_rank = -1;
  }
  if (options.min_nodes != -1) plan.min_nodes = options.min_nodes;
  plan.master_addr =
      options.master_addr.empty() ? plan.nodes[0].host : options.master_addr;
  plan.master_port = options.master_port;
  return plan;
}

Plan AgentPool(const Plan& plan) {
  Plan pool = plan;
  pool.nodes.assign(plan.nodes.size() + plan.spares.size(), NodePlan());
  for (const auto* part : {&plan.nodes, &plan.spares}) {
    for (const NodePlan& node : *part)
      pool.nodes.at(static_cast<size_t>(node.agent)) = node;
  }
  pool.spares.clear();
  pool.min_nodes = 0;
  pool.world_size = 0;
  for (size_t i = 0; i < pool.nodes.size(); ++i) {
    NodePlan& node = pool.nodes[i];
    node.agent = node.node_rank = static_cast<int>(i);
    node.first_rank = pool.world_size;
    pool.world_size += static_cast<int>(node.slots.size());
  }
  return pool;
}

Plan GenerationPlan(const Plan& pool, const std::vector<int>& agents,
                    const std::string& master_addr, int master_port) {
  Plan plan;
  for (int agent : agents) {
    NodePlan node = pool.nodes.at(static_cast<size_t>(agent));
    node.agent = agent;
    node.node_rank = static_cast<int>(plan.nodes.size());
    node.first_rank = plan.world_size;
    plan.world_size += static_cast<int>(node.slots.size());
    plan.nodes.push_back(std::move(node));
  }
  plan.master_addr = master_addr;
  plan.master_port = master_port;
  return plan;
}

Status ParseNumNodes(std::string_view text, int max_nodes,
                     PlanOptions& options) {
  auto number = [](std::string_view s, int& out) {
    if (s.empty() || s.size() > 9) return false;
    out = 0;
    for (char c : s) {
      if (c < '0' || c > '9') return false;
      out = out * 10 + (c - '0');
    }
    return true;
  };
  const size_t colon = text.find(':');
  if (colon == std::string_view::npos) {
    // N: as every integer flag says it.
    int n = 0;
    const bool negative = !text.empty() && text[0] == '-';
    if (number(negative ? text.substr(1) : text, n) &&
        (negative || n < 1 || n > max_nodes)) {
      return InvalidArgument("--num_nodes must be in 1.." +
                             std::to_string(max_nodes) + ", got " +
                             std::string(text));
    }
  }
  int min = 0, max = 0;
  const bool ok = colon == std::string_view::npos
                      ? number(text, max)
                      : number(text.substr(0, colon), min) &&
                            number(text.substr(colon + 1), max);
  if (!ok) {
    return InvalidArgument(
        "--num_nodes must be N or MIN:MAX (whole numbers), "
        "got " +
        Quoted(text.substr(0, 40)));
  }
  if (colon == std::string_view::npos) min = max;
  if (min < 1 || max > max_nodes || min > max) {
    return InvalidArgument(
        "--num_nodes " + std::string(text) +
        ": need 1 <= MIN <= MAX <= " + std::to_string(max_nodes));
  }
  options.num_nodes = max;
  options.min_nodes = colon == std::string_view::npos ? -1 : min;
  return Status::Ok();
}

Plan JoinPlan(const std::vector<std::string>& hosts,
              const std::vector<int>& slots, const PlanOptions& options) {
  Plan plan;
  for (size_t i = 0; i < hosts.size(); ++i) {
    NodePlan node;
    node.node_rank = node.agent = static_cast<int>(i);
    node.host = hosts[i];
    for (int s = 0; s < slots.at(i); ++s) node.slots.push_back(s);
    node.first_rank = plan.world_size;
    plan.world_size += slots[i];
    plan.nodes.push_back(std::move(node));
  }
  plan.master_addr = options.master_addr;
  plan.master_port = options.master_port;
  if (options.min_nodes > 0) plan.min_nodes = options.min_nodes;
  return plan;
}

std::string FormatPlanTable(const Plan& plan) {
  const std::vector<std::string> header = {"host", "node_rank", "local_rank",
                                           "global_rank", "gpu"};
  std::vector<std::vector<std::string>> rows = {header};
  for (const NodePlan& node : plan.nodes) {
    for (size_t local = 0; local < node.slots.size(); ++local) {
      rows.push_back({node.host, std::to_string(node.node_rank),
                      std::to_string(local),
                      std::to_string(node.first_rank + static_cast<int>(local)),
                      std::to_string(node.slots[local])});
    }
  }
  std::vector<size_t> widths(header.size(), 0);
  for (const auto& row : rows) {
    for (size_t c = 0; c < row.size(); ++c)
      widths[c] = std::max(widths[c], row[c].size());
  }
  std::string out;
  for (const auto& row : rows) {
    for (size_t c = 0; c + 1 < row.size(); ++c)
      out += PadRight(row[c], widths[c]) + "  ";
    out += row.back() + "\n";
  }
  out += Plural(plan.nodes.size(), "node") + ", " +
         Plural(static_cast<size_t>(plan.world_size), "rank") + ", master " +
         (plan.master_port > 0
              ? base::JoinHostPort(plan.master_addr, plan.master_port)
              : plan.master_addr + " (port: one free on node 0, at launch)") +
         "\n";
  if (plan.min_nodes > 0) {
    out += "a later generation runs on " + std::to_string(plan.min_nodes) +
           " to " + Plural(plan.nodes.size(), "node") + " (--num_nodes " +
           std::to_string(plan.min_nodes) + ":" +
           std::to_string(plan.nodes.size()) + "), ranks renumbered\n";
  }
  if (!plan.spares.empty()) {
    std::string hosts;
    for (const NodePlan& node : plan.spares)
      hosts += (hosts.empty() ? "" : ", ") + node.host;
    out += "spares, standing by to take a lost node's place: " + hosts + "\n";
  }
  return out;
}

}  // namespace dslaunch::launcher
