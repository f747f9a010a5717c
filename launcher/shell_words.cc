#include "launcher/shell_words.h"

namespace dslaunch::launcher {

StatusOr<std::vector<std::string>> SplitShellWords(const std::string& text) {
  std::vector<std::string> words;
  std::string word;
  bool in_word = false;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (c == ' ' || c == '\t' || c == '\n') {
      if (in_word) words.push_back(std::move(word));
      word.clear();
      in_word = false;
      continue;
    }
    in_word = true;
    if (c == '\'') {
      const size_t end = text.find('\'', i + 1);
      if (end == std::string::npos)
        return InvalidArgument("unterminated ' quote");
      word.append(text, i + 1, end - i - 1);
      i = end;
    } else if (c == '"') {
      for (++i;; ++i) {
        if (i >= text.size()) return InvalidArgument("unterminated \" quote");
        if (text[i] == '"') break;
        // Inside "...", a backslash escapes only these (as in sh).
        if (text[i] == '\\' && i + 1 < text.size() &&
            std::string_view("\"\\$`").find(text[i + 1]) !=
                std::string_view::npos)
          ++i;
        word.push_back(text[i]);
      }
    } else if (c == '\\') {
      if (i + 1 >= text.size()) return InvalidArgument("trailing backslash");
      word.push_back(text[++i]);
    } else {
      word.push_back(c);
    }
  }
  if (in_word) words.push_back(std::move(word));
  return words;
}

}  // namespace dslaunch::launcher
