#include "launcher/report/line_folder.h"

#include <algorithm>

#include "proto/host_info.h"  // CpuListString: "0-7,9"

namespace dslaunch::launcher {

bool LineFolder::Add(int rank, bool is_stderr, std::string_view line,
                     double now) {
  std::string key(1, is_stderr ? 'e' : 'o');
  key.append(line);
  auto& numbers = with_text_[key];
  // The oldest group with this text that comes after this rank's newest:
  // joining it keeps the rank's lines in order (ranks whose lines come in
  // batches, one rank after another, still fold into one group per line).
  auto last = last_of_rank_.find(rank);
  auto it =
      last == last_of_rank_.end()
          ? numbers.begin()
          : std::upper_bound(numbers.begin(), numbers.end(), last->second);
  if (it != numbers.end()) {
    groups_[*it - base_].ranks.push_back(rank);
    last_of_rank_[rank] = *it;
    return held_bytes_ >= kMaxPendingBytes;
  }
  const uint64_t number = base_ + groups_.size();
  groups_.push_back(Group{is_stderr, {rank}, std::string(line), now});
  held_bytes_ += key.size() * 2 + sizeof(Group) + sizeof(uint64_t);
  numbers.push_back(number);
  last_of_rank_[rank] = number;
  return held_bytes_ >= kMaxPendingBytes;
}

std::vector<LineFolder::Group> LineFolder::Take(double now, bool all) {
  std::vector<Group> out;
  while (!groups_.empty() &&
         (all || now - groups_.front().first >= window_s_)) {
    Group& g = groups_.front();
    std::string key(1, g.is_stderr ? 'e' : 'o');
    key += g.text;
    // Groups leave oldest first: this one is first in its text's list.
    if (auto it = with_text_.find(key); it != with_text_.end()) {
      if (!it->second.empty() && it->second.front() == base_)
        it->second.pop_front();
      if (it->second.empty()) with_text_.erase(it);
    }
    held_bytes_ -= key.size() * 2 + sizeof(Group) + sizeof(uint64_t);
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
           " nodes:" + proto::CpuListString(ranks) + "] ";
  }
  std::string out = "[";
  for (const auto& [host, list] : by_host) {
    if (out.size() > 1) out += ",";
    out += host + ":" + proto::CpuListString(list);
  }
  return out + "] ";
}

}  // namespace dslaunch::launcher
