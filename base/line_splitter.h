// LineSplitter cuts a byte stream (a child's stdout or stderr, a remote
// shell's output) into whole lines. Bytes without a newline yet are held
// until more arrive or the stream ends, so no line is ever torn; a line
// longer than the limit is passed on in limit-sized pieces. Passive and
// single-threaded; the one line splitter of the project.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace dslaunch::base {

class LineSplitter {
 public:
  explicit LineSplitter(size_t max_line_bytes = 1 << 20)
      : max_line_bytes_(max_line_bytes) {}

  struct Piece {
    std::string text;  // without the '\n'
    bool ends_line;    // false: a limit-sized piece; the line goes on
  };
  // Appends the complete lines in `data` (without '\n') to `lines`.
  void Feed(std::string_view data, std::vector<std::string>* lines);
  // The same, saying which pieces end their line.
  void Feed(std::string_view data, std::vector<Piece>* pieces);
  // At end of stream: the unterminated rest, if any (returns false if none).
  bool Finish(std::string* rest);

 private:
  size_t max_line_bytes_;
  std::string pending_;
};

}  // namespace dslaunch::base
