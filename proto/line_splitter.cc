#include "proto/line_splitter.h"

namespace dslaunch::proto {

void LineSplitter::Feed(std::string_view data,
                        std::vector<std::string>* lines) {
  while (!data.empty()) {
    const size_t nl = data.find('\n');
    pending_.append(nl == std::string_view::npos ? data : data.substr(0, nl));
    // A full piece is held until we know more bytes follow it, so a line of
    // exactly the limit is one line however it was fed.
    while (pending_.size() > max_line_bytes_) {
      lines->emplace_back(pending_, 0, max_line_bytes_);
      pending_.erase(0, max_line_bytes_);
    }
    if (nl == std::string_view::npos) break;
    lines->push_back(std::move(pending_));
    pending_.clear();
    data.remove_prefix(nl + 1);
  }
}

bool LineSplitter::Finish(std::string* rest) {
  if (pending_.empty()) return false;
  *rest = std::move(pending_);
  pending_.clear();
  return true;
}

}  // namespace dslaunch::proto
