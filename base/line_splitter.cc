#include "base/line_splitter.h"

namespace dslaunch::base {

void LineSplitter::Feed(std::string_view data, std::vector<Piece>* pieces) {
  while (!data.empty()) {
    const size_t nl = data.find('\n');
    pending_.append(nl == std::string_view::npos ? data : data.substr(0, nl));
    // A full piece is held until we know more bytes follow it, so a line of
    // exactly the limit is one line however it was fed.
    while (pending_.size() > max_line_bytes_) {
      pieces->push_back({pending_.substr(0, max_line_bytes_), false});
      pending_.erase(0, max_line_bytes_);
    }
    if (nl == std::string_view::npos) break;
    pieces->push_back({std::move(pending_), true});
    pending_.clear();
    data.remove_prefix(nl + 1);
  }
}

void LineSplitter::Feed(std::string_view data,
                        std::vector<std::string>* lines) {
  std::vector<Piece> pieces;
  Feed(data, &pieces);
  for (auto& p : pieces) lines->push_back(std::move(p.text));
}

bool LineSplitter::Finish(std::string* rest) {
  if (pending_.empty()) return false;
  *rest = std::move(pending_);
  pending_.clear();
  return true;
}

}  // namespace dslaunch::base
