// LineFolder: folds identical lines that several ranks write within a short
// window into one, shown as "[node1:0-7] text" (what dshbak -c does for
// pdsh). Lines of one rank keep their order; a rank's line repeated is shown
// again. Memory is bounded: past kMaxPendingBytes the caller takes every
// group at once. Owned by the Console; main thread only; time is passed in.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <map>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace dslaunch::launcher {

class LineFolder {
 public:
  static constexpr size_t kMaxPendingBytes = 1u << 20;

  struct Group {
    bool is_stderr = false;
    std::vector<int> ranks;  // in the order their lines came
    std::string text;
    double first = 0;  // when the first of them came
    // The next held group whose stream and text hash alike (a chain per
    // hash, oldest first), kNone at the end.
    uint64_t next = kNone;
    uint64_t hash = 0;
    uint64_t number = 0;  // since the folder's start
  };
  static constexpr uint64_t kNone = UINT64_MAX;

  explicit LineFolder(double window_s) : window_s_(window_s) {}

  // Holds one line. Returns true when the held lines reached the bound.
  bool Add(int rank, bool is_stderr, std::string_view line, double now);
  // The groups whose window has passed (every group when `all`), oldest
  // first.
  std::vector<Group> Take(double now, bool all);
  bool empty() const { return groups_.empty(); }

 private:
  std::deque<Group> groups_;
  uint64_t base_ = 0;  // the number of groups_.front() since the start
  // Hash of stream and text -> the oldest and newest held group with it;
  // Group::next links the rest. No copy of the text is kept as a key.
  struct Chain {
    uint64_t head;
    uint64_t tail;
  };
  std::unordered_map<uint64_t, Chain> chains_;
  // Groups of a chain looked at before taking its newest (bounds the cost
  // of a line to a constant however many groups hold its text).
  static constexpr int kMaxWalk = 16;
  // The group of `chain` a line may join: it must come at or after
  // `after` (the number past the rank's newest group); nullptr if none.
  Group* Join(const Chain& chain, uint64_t after, bool is_stderr,
              std::string_view line);
  std::unordered_map<int, uint64_t> last_of_rank_;  // rank -> its newest group
  size_t held_bytes_ = 0;
  double window_s_;
};

// "[node1:0-7] " for ranks of one host, "[node1:0-3,node2:4-7] " for up to
// three, "[5 nodes:0-39] " beyond.
std::string FoldedPrefix(std::vector<int> ranks,
                         const std::map<int, std::string>& host_of);

}  // namespace dslaunch::launcher
