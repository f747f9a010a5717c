#include "base/utf8.h"

#include <algorithm>
#include <iterator>

namespace dslaunch::base {

namespace {

struct Range {
  char32_t first, last;
};

// Zero-width: combining marks, zero-width space/joiners, marks of direction,
// word joiner and invisible operators, variation selectors, combining half
// marks, the BOM, tag characters.
constexpr Range kZeroWidth[] = {
    {0x0300, 0x036F}, {0x0483, 0x0489},   {0x0591, 0x05BD},   {0x0610, 0x061A},
    {0x064B, 0x065F}, {0x0E31, 0x0E31},   {0x0E34, 0x0E3A},   {0x0E47, 0x0E4E},
    {0x1AB0, 0x1AFF}, {0x1DC0, 0x1DFF},   {0x200B, 0x200F},   {0x202A, 0x202E},
    {0x2060, 0x2064}, {0x20D0, 0x20FF},   {0xFE00, 0xFE0F},   {0xFE20, 0xFE2F},
    {0xFEFF, 0xFEFF}, {0xE0000, 0xE007F}, {0xE0100, 0xE01EF},
};

// Two columns: Hangul Jamo, CJK radicals to Yi, Hangul syllables, CJK
// compatibility, vertical and small forms, full-width forms, the emoji and
// pictograph blocks, and the supplementary ideographic planes. Some symbols
// in these blocks are narrow on some terminals: counting them wide is safe.
constexpr Range kWide[] = {
    {0x1100, 0x115F},   {0x231A, 0x231B},   {0x2329, 0x232A},
    {0x23E9, 0x23EC},   {0x23F0, 0x23F0},   {0x23F3, 0x23F3},
    {0x25FD, 0x25FE},   {0x2614, 0x2615},   {0x2648, 0x2653},
    {0x267F, 0x267F},   {0x2693, 0x2693},   {0x26A1, 0x26A1},
    {0x26AA, 0x26AB},   {0x26BD, 0x26BE},   {0x26C4, 0x26C5},
    {0x26CE, 0x26CE},   {0x26D4, 0x26D4},   {0x26EA, 0x26EA},
    {0x26F2, 0x26F3},   {0x26F5, 0x26F5},   {0x26FA, 0x26FA},
    {0x26FD, 0x26FD},   {0x2705, 0x2705},   {0x270A, 0x270B},
    {0x2728, 0x2728},   {0x274C, 0x274C},   {0x274E, 0x274E},
    {0x2753, 0x2755},   {0x2757, 0x2757},   {0x2795, 0x2797},
    {0x27B0, 0x27B0},   {0x27BF, 0x27BF},   {0x2B1B, 0x2B1C},
    {0x2B50, 0x2B50},   {0x2B55, 0x2B55},   {0x2E80, 0x303E},
    {0x3041, 0x33FF},   {0x3400, 0x4DBF},   {0x4E00, 0x9FFF},
    {0xA000, 0xA4CF},   {0xA960, 0xA97F},   {0xAC00, 0xD7A3},
    {0xF900, 0xFAFF},   {0xFE10, 0xFE19},   {0xFE30, 0xFE6F},
    {0xFF00, 0xFF60},   {0xFFE0, 0xFFE6},   {0x16FE0, 0x16FE4},
    {0x17000, 0x18AFF}, {0x1B000, 0x1B2FF}, {0x1F004, 0x1F004},
    {0x1F0CF, 0x1F0CF}, {0x1F18E, 0x1F18E}, {0x1F191, 0x1F19A},
    {0x1F200, 0x1F251}, {0x1F300, 0x1F64F}, {0x1F680, 0x1F6FF},
    {0x1F7E0, 0x1F7EB}, {0x1F900, 0x1F9FF}, {0x1FA70, 0x1FAFF},
    {0x20000, 0x2FFFD}, {0x30000, 0x3FFFD},
};

template <size_t N>
bool In(const Range (&table)[N], char32_t c) {
  const Range* end = table + N;
  const Range* r = std::upper_bound(
      table, end, c, [](char32_t v, const Range& x) { return v < x.first; });
  return r != table && c <= std::prev(r)->last;
}

// The code point of the valid sequence of `n` bytes at the start of `s`.
char32_t Decode(std::string_view s, size_t n) {
  const auto b = [&](size_t i) { return static_cast<unsigned char>(s[i]); };
  if (n == 1) return b(0);
  char32_t c = b(0) & (0x7F >> n);
  for (size_t i = 1; i < n; ++i) c = (c << 6) | (b(i) & 0x3F);
  return c;
}

// Bytes and columns of the character at the start of `s` (an invalid byte
// is one byte, one column).
size_t Next(std::string_view s, int& columns) {
  const size_t n = Utf8SequenceLength(s);
  if (n == 0) {
    columns = 1;
    return 1;
  }
  columns = TerminalColumns(Decode(s, n));
  return n;
}

}  // namespace

size_t Utf8SequenceLength(std::string_view s) {
  if (s.empty()) return 0;
  const auto b = [&](size_t i) { return static_cast<unsigned char>(s[i]); };
  const unsigned char lead = b(0);
  if (lead < 0x80) return 1;
  const size_t n = lead >= 0xF0 && lead <= 0xF4   ? 4
                   : lead >= 0xE0 && lead <= 0xEF ? 3
                   : lead >= 0xC2 && lead <= 0xDF ? 2
                                                  : 0;
  if (n == 0 || n > s.size()) return 0;
  for (size_t i = 1; i < n; ++i) {
    if ((b(i) & 0xC0) != 0x80) return 0;
  }
  // Overlong three- and four-byte forms, surrogates, beyond U+10FFFF.
  if ((lead == 0xE0 && b(1) < 0xA0) || (lead == 0xED && b(1) > 0x9F) ||
      (lead == 0xF0 && b(1) < 0x90) || (lead == 0xF4 && b(1) > 0x8F)) {
    return 0;
  }
  return n;
}

int TerminalColumns(char32_t c) {
  if (c < 0x300) return 1;  // ASCII and Latin-1 (controls are escaped)
  if (In(kZeroWidth, c)) return 0;
  return In(kWide, c) ? 2 : 1;
}

size_t DisplayColumns(std::string_view text) {
  size_t total = 0;
  int columns = 0;
  for (size_t i = 0; i < text.size();) {
    i += Next(text.substr(i), columns);
    total += static_cast<size_t>(columns);
  }
  return total;
}

std::string CutToColumns(std::string_view text, size_t columns) {
  size_t used = 0;
  int width = 0;
  for (size_t i = 0; i < text.size();) {
    const size_t n = Next(text.substr(i), width);
    // A zero-width mark stays with the character before it.
    if (width > 0 && used + static_cast<size_t>(width) > columns)
      return std::string(text.substr(0, i));
    used += static_cast<size_t>(width);
    i += n;
  }
  return std::string(text);
}

}  // namespace dslaunch::base
