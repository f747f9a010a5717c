#include "launcher/report/line_folder.h"

#include <algorithm>

#include "proto/host_info.h"  // CpuListString: "0-7,9"

namespace dslaunch::launcher {

bool LineFolder::Add(int rank, bool is_stderr, std::string_view line,
                     double now) {
  std::string key(1, is_stderr ? 'e' : 'o');
  key.append(line);
  auto last = last_of_rank_.find(rank);
  auto it = newest_.find(key);
  // Joining a group is only allowed when it comes after this rank's
  // newest: its lines must not change order.
  if (it != newest_.end() && it->second >= base_ &&
      (last == last_of_rank_.end() || last->second < it->second)) {
    groups_[it->second - base_].ranks.push_back(rank);
    last_of_rank_[rank] = it->second;
    return held_bytes_ >= kMaxPendingBytes;
  }
  const uint64_t number = base_ + groups_.size();
  groups_.push_back(Group{is_stderr, {rank}, std::string(line), now});
  held_bytes_ += key.size() * 2 + sizeof(Group);
  newest_[std::move(key)] = number;
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
    if (auto it = newest_.find(key); it != newest_.end() && it->second == base_)
      newest_.erase(it);
    held_bytes_ -= key.size() * 2 + sizeof(Group);
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
