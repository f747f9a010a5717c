// A byte-level BPE tokenizer: 256 byte tokens, one end-of-text token (256),
// then merges learned from a corpus. Text is first cut into pieces the way
// GPT-2 does it in spirit (a word with its leading space, a run of digits, a
// run of punctuation, whitespace), and merges never cross pieces. Training is
// deterministic (ties go to the smaller pair). Value type; the const methods
// may be called from any thread.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "base/status.h"

namespace dslaunch::worker {

class BpeTokenizer {
 public:
  static constexpr int kEndOfText = 256;

  // Learns merges until the vocabulary has `vocab_size` tokens (>= 257), or
  // until no pair occurs twice (a small corpus gives a smaller vocabulary).
  static StatusOr<BpeTokenizer> Train(std::string_view text, int vocab_size);
  static StatusOr<BpeTokenizer> Load(const std::string& path);
  Status Save(const std::string& path) const;

  std::vector<int> Encode(std::string_view text) const;
  std::string Decode(const std::vector<int>& tokens) const;
  std::string TokenBytes(int token) const;
  int vocab_size() const { return 257 + static_cast<int>(merges_.size()); }

  // Cuts text into the pieces that merges stay within.
  static std::vector<std::string_view> Pieces(std::string_view text);

 private:
  void Rebuild();  // ranks_ and bytes_ from merges_
  std::vector<int> EncodePiece(std::string_view piece) const;

  std::vector<std::pair<int, int>> merges_;  // token 257 + i = merges_[i]
  std::unordered_map<uint64_t, int> ranks_;  // pair -> merge index
  std::vector<std::string> bytes_;           // token -> its bytes
};

}  // namespace dslaunch::worker
