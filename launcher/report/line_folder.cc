#include "launcher/report/line_folder.h"

#include <algorithm>

#include "base/host_info.h"  // CpuListString: "0-7,9"

namespace dslaunch::launcher {

namespace {

uint64_t HashOf(bool is_stderr, std::string_view line) {
  return std::hash<std::string_view>()(line) * 2 + (is_stderr ? 1 : 0);
}

}  // namespace

LineFolder::Group* LineFolder::Join(const Chain& chain, uint64_t after,
                                    bool is_stderr, std::string_view line) {
  auto fits = [&](Group& g) {
    return g.number >= after && g.is_stderr == is_stderr && g.text == line;
  };
  // A rank repeating its line: the group after its own newest, at once.
  if (after > base_ && after - 1 - base_ < groups_.size()) {
    Group& own = groups_[after - 1 - base_];
    if (own.hash == groups_[chain.head - base_].hash) {
      int steps = 0;  // only hash collisions make this walk long
      for (uint64_t n = own.next; n != kNone && steps < kMaxWalk;
           n = groups_[n - base_].next, ++steps) {
        if (fits(groups_[n - base_])) return &groups_[n - base_];
      }
      return nullptr;
    }
  }
  // Otherwise the oldest fitting group, looked for among the first few of
  // the chain; past them the newest fits as well (order is kept either way).
  int steps = 0;
  for (uint64_t n = chain.head; n != kNone && steps < kMaxWalk;
       n = groups_[n - base_].next, ++steps) {
    if (fits(groups_[n - base_])) return &groups_[n - base_];
  }
  Group& tail = groups_[chain.tail - base_];
  return steps == kMaxWalk && fits(tail) ? &tail : nullptr;
}

bool LineFolder::Add(int rank, bool is_stderr, std::string_view line,
                     double now) {
  const uint64_t hash = HashOf(is_stderr, line);
  auto last = last_of_rank_.find(rank);
  const uint64_t after = last == last_of_rank_.end() ? 0 : last->second + 1;
  auto chain = chains_.find(hash);
  // The oldest group with this text that comes after this rank's newest:
  // joining it keeps the rank's lines in order (ranks whose lines come in
  // batches, one rank after another, still fold into one group per line).
  if (chain != chains_.end()) {
    if (Group* g = Join(chain->second, after, is_stderr, line)) {
      g->ranks.push_back(rank);
      held_bytes_ += sizeof(int);
      last_of_rank_[rank] = g->number;
      return held_bytes_ >= kMaxPendingBytes;
    }
  }
  const uint64_t number = base_ + groups_.size();
  Group& g = groups_.emplace_back();
  g.number = number;
  g.is_stderr = is_stderr;
  g.ranks.push_back(rank);
  g.text.assign(line);
  g.first = now;
  g.hash = hash;
  if (chain == chains_.end()) {
    chains_.emplace(hash, Chain{number, number});
  } else {
    groups_[chain->second.tail - base_].next = number;
    chain->second.tail = number;
  }
  held_bytes_ += line.size() + sizeof(Group);
  last_of_rank_[rank] = number;
  return held_bytes_ >= kMaxPendingBytes;
}

std::vector<LineFolder::Group> LineFolder::Take(double now, bool all) {
  std::vector<Group> out;
  while (!groups_.empty() &&
         (all || now - groups_.front().first >= window_s_)) {
    Group& g = groups_.front();
    // Groups leave oldest first: this one heads its chain.
    if (auto it = chains_.find(g.hash); it != chains_.end()) {
      if (g.next == kNone) {
        chains_.erase(it);
      } else {
        it->second.head = g.next;
      }
    }
    held_bytes_ -=
        g.text.size() + sizeof(Group) + (g.ranks.size() - 1) * sizeof(int);
    out.push_back(std::move(g));
    groups_.pop_front();
    ++base_;
  }
  return out;
}

std::string FoldedPrefix(std::vector<int> ranks,
                         const std::map<int, std::string>& host_of) {
  std::sort(ranks.begin(), ranks.end());
  std::vector<std::pair<std::string, std::vector<int>>> by_host;
  for (int rank : ranks) {
    auto it = host_of.find(rank);
    const std::string host = it == host_of.end() ? "?" : it->second;
    if (by_host.empty() || by_host.back().first != host)
      by_host.push_back({host, {}});
    by_host.back().second.push_back(rank);
  }
  if (by_host.size() > 3) {
    return "[" + std::to_string(by_host.size()) +
           " nodes:" + base::CpuListString(ranks) + "] ";
  }
  std::string out = "[";
  for (const auto& [host, list] : by_host) {
    if (out.size() > 1) out += ",";
    out += host + ":" + base::CpuListString(list);
  }
  return out + "] ";
}

}  // namespace dslaunch::launcher
