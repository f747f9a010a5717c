#include "worker/bpe.h"

#include <algorithm>
#include <cctype>
#include <fstream>
#include <map>
#include <sstream>

namespace dslaunch::worker {

namespace {

uint64_t Key(int a, int b) {
  return (static_cast<uint64_t>(a) << 32) | static_cast<uint32_t>(b);
}

enum class Kind { kSpace, kLetter, kDigit, kOther };

Kind KindOf(unsigned char c) {
  if (c == ' ' || c == '\t' || c == '\n' || c == '\r') return Kind::kSpace;
  if (std::isalpha(c) || c >= 0x80 || c == '\'') return Kind::kLetter;
  if (std::isdigit(c)) return Kind::kDigit;
  return Kind::kOther;
}

// Merges every occurrence of (a, b) in `word` into `token`.
void MergeInPlace(std::vector<int>* word, int a, int b, int token) {
  size_t out = 0;
  for (size_t i = 0; i < word->size(); ++i) {
    if (i + 1 < word->size() && (*word)[i] == a && (*word)[i + 1] == b) {
      (*word)[out++] = token;
      ++i;
    } else {
      (*word)[out++] = (*word)[i];
    }
  }
  word->resize(out);
}

}  // namespace

std::vector<std::string_view> BpeTokenizer::Pieces(std::string_view text) {
  std::vector<std::string_view> pieces;
  size_t i = 0;
  while (i < text.size()) {
    size_t start = i;
    if (KindOf(text[i]) == Kind::kSpace) {
      // A run of whitespace before a word gives its last space to the word.
      size_t j = i;
      while (j < text.size() && KindOf(text[j]) == Kind::kSpace) ++j;
      if (j < text.size() && text[j - 1] == ' ' && j - i > 1) {
        pieces.push_back(text.substr(i, j - 1 - i));
        i = j - 1;
        continue;
      }
    }
    // A single space joins the piece that follows (" word"), as in GPT-2.
    if (text[i] == ' ' && i + 1 < text.size() &&
        KindOf(text[i + 1]) != Kind::kSpace)
      ++i;
    const Kind kind = KindOf(text[i]);
    while (i < text.size() && KindOf(text[i]) == kind) ++i;
    pieces.push_back(text.substr(start, i - start));
  }
  return pieces;
}

StatusOr<BpeTokenizer> BpeTokenizer::Train(std::string_view text,
                                           int vocab_size) {
  if (vocab_size < 257)
    return InvalidArgument("BPE vocabulary must have at least 257 tokens");
  std::unordered_map<std::string_view, int64_t> counts;
  for (auto piece : Pieces(text)) ++counts[piece];
  std::vector<std::vector<int>> words;
  std::vector<int64_t> freq;
  for (auto& [piece, n] : counts) {
    words.emplace_back(piece.begin(), piece.end());
    for (int& t : words.back()) t &= 0xff;
    freq.push_back(n);
  }
  BpeTokenizer tok;
  while (tok.vocab_size() < vocab_size) {
    std::unordered_map<uint64_t, int64_t> pairs;
    for (size_t w = 0; w < words.size(); ++w) {
      for (size_t i = 0; i + 1 < words[w].size(); ++i) {
        pairs[Key(words[w][i], words[w][i + 1])] += freq[w];
      }
    }
    uint64_t best = 0;
    int64_t best_n = 0;
    for (auto& [k, n] : pairs) {
      if (n > best_n || (n == best_n && k < best)) best = k, best_n = n;
    }
    if (best_n < 2) break;  // nothing left worth merging
    const int a = static_cast<int>(best >> 32),
              b = static_cast<int>(best & 0xffffffff);
    const int token = tok.vocab_size();
    tok.merges_.emplace_back(a, b);
    for (auto& w : words) MergeInPlace(&w, a, b, token);
  }
  tok.Rebuild();
  return tok;
}

void BpeTokenizer::Rebuild() {
  ranks_.clear();
  bytes_.assign(257, "");
  for (int b = 0; b < 256; ++b)
    bytes_[b] = std::string(1, static_cast<char>(b));
  bytes_[kEndOfText] = "<|endoftext|>";
  for (size_t i = 0; i < merges_.size(); ++i) {
    ranks_[Key(merges_[i].first, merges_[i].second)] = static_cast<int>(i);
    bytes_.push_back(bytes_[merges_[i].first] + bytes_[merges_[i].second]);
  }
}

std::vector<int> BpeTokenizer::EncodePiece(std::string_view piece) const {
  std::vector<int> word(piece.begin(), piece.end());
  for (int& t : word) t &= 0xff;
  while (word.size() > 1) {
    int best_rank = -1;
    for (size_t i = 0; i + 1 < word.size(); ++i) {
      auto it = ranks_.find(Key(word[i], word[i + 1]));
      if (it != ranks_.end() && (best_rank < 0 || it->second < best_rank))
        best_rank = it->second;
    }
    if (best_rank < 0) break;
    const auto& [a, b] = merges_[best_rank];
    MergeInPlace(&word, a, b, 257 + best_rank);
  }
  return word;
}

std::vector<int> BpeTokenizer::Encode(std::string_view text) const {
  std::vector<int> out;
  std::unordered_map<std::string_view, std::vector<int>> cache;
  for (auto piece : Pieces(text)) {
    auto it = cache.find(piece);
    if (it == cache.end()) it = cache.emplace(piece, EncodePiece(piece)).first;
    out.insert(out.end(), it->second.begin(), it->second.end());
  }
  return out;
}

std::string BpeTokenizer::TokenBytes(int token) const {
  return token >= 0 && token < static_cast<int>(bytes_.size()) ? bytes_[token]
                                                               : "";
}

std::string BpeTokenizer::Decode(const std::vector<int>& tokens) const {
  std::string out;
  for (int t : tokens) {
    if (t != kEndOfText) out += TokenBytes(t);
  }
  return out;
}

Status BpeTokenizer::Save(const std::string& path) const {
  const std::string tmp = path + ".tmp";
  {
    std::ofstream f(tmp, std::ios::trunc);
    f << "dsl-bpe 1 " << vocab_size() << "\n";
    for (auto& [a, b] : merges_) f << a << " " << b << "\n";
    if (!f.flush()) return DataError("cannot write tokenizer " + tmp);
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    return DataError("cannot rename " + tmp + " to " + path);
  }
  return Status::Ok();
}

StatusOr<BpeTokenizer> BpeTokenizer::Load(const std::string& path) {
  std::ifstream f(path);
  if (!f) return DataError("cannot read tokenizer " + path);
  std::string magic;
  int version = 0, vocab = 0;
  if (!(f >> magic >> version >> vocab) || magic != "dsl-bpe" || version != 1) {
    return DataError(path + ": not a dsl-bpe tokenizer file (version 1)");
  }
  BpeTokenizer tok;
  int a, b, line = 1;
  while (f >> a >> b) {
    ++line;
    const int next = tok.vocab_size();
    if (a < 0 || b < 0 || a >= next || b >= next || a == kEndOfText ||
        b == kEndOfText) {
      return DataError(path + ":" + std::to_string(line) + ": bad merge " +
                       std::to_string(a) + " " + std::to_string(b));
    }
    tok.merges_.emplace_back(a, b);
  }
  if (tok.vocab_size() != vocab) {
    return DataError(path + ": header says " + std::to_string(vocab) +
                     " tokens, file has " + std::to_string(tok.vocab_size()));
  }
  tok.Rebuild();
  return tok;
}

}  // namespace dslaunch::worker
