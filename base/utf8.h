// UTF-8 as the launcher meets it in ranks' output and hostnames: the length
// of a valid sequence (for escaping and for Prometheus label values), and the
// columns text takes on a terminal (for the live table, whose lines must
// never wrap or the redraw in place goes astray). Pure functions, any thread.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace dslaunch::base {

// Bytes of the valid UTF-8 sequence at the start of `s` (1 for ASCII), or 0
// when it is not one: a stray continuation byte, an overlong form, a
// surrogate, a code point above U+10FFFF, or a sequence cut short.
size_t Utf8SequenceLength(std::string_view s);

// Columns code point `c` takes on a terminal: 0 for combining marks,
// zero-width joiners and variation selectors; 2 for East Asian wide and
// full-width characters and emoji; 1 otherwise. Where terminals disagree
// (emoji presentation), the wider answer: a line counted too wide only ends
// early, one counted too narrow wraps.
int TerminalColumns(char32_t c);

// Columns `text` takes; a byte that is not valid UTF-8 counts as one column
// (escape such text before it reaches a terminal).
size_t DisplayColumns(std::string_view text);

// The longest prefix of `text` that fits in `columns`, never splitting a
// character (with its combining marks) or a wide character at the edge.
std::string CutToColumns(std::string_view text, size_t columns);

}  // namespace dslaunch::base
