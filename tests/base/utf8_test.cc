#include "base/utf8.h"

#include <gtest/gtest.h>

#include <string>

namespace dslaunch::base {
namespace {

TEST(Utf8SequenceLength, MeasuresValidSequences) {
  EXPECT_EQ(Utf8SequenceLength("a"), 1u);
  EXPECT_EQ(Utf8SequenceLength("\xC3\xA9"), 2u);          // é
  EXPECT_EQ(Utf8SequenceLength("\xE8\xAE\xAD"), 3u);      // 训
  EXPECT_EQ(Utf8SequenceLength("\xF0\x9F\x9A\x80"), 4u);  // U+1F680
  EXPECT_EQ(Utf8SequenceLength("\xF4\x8F\xBF\xBF"), 4u);  // U+10FFFF
}

TEST(Utf8SequenceLength, RefusesWhatIsNotUtf8) {
  EXPECT_EQ(Utf8SequenceLength(""), 0u);
  EXPECT_EQ(Utf8SequenceLength("\x80"), 0u);              // continuation
  EXPECT_EQ(Utf8SequenceLength("\xC0\xAF"), 0u);          // overlong '/'
  EXPECT_EQ(Utf8SequenceLength("\xC1\xBF"), 0u);          // overlong
  EXPECT_EQ(Utf8SequenceLength("\xE0\x80\xAF"), 0u);      // overlong
  EXPECT_EQ(Utf8SequenceLength("\xED\xA0\x80"), 0u);      // surrogate D800
  EXPECT_EQ(Utf8SequenceLength("\xF0\x80\x80\xAF"), 0u);  // overlong
  EXPECT_EQ(Utf8SequenceLength("\xF4\x90\x80\x80"), 0u);  // above U+10FFFF
  EXPECT_EQ(Utf8SequenceLength("\xF5\x80\x80\x80"), 0u);
  EXPECT_EQ(Utf8SequenceLength("\xFF"), 0u);
  EXPECT_EQ(Utf8SequenceLength("\xE8\xAE"), 0u);  // cut short
  EXPECT_EQ(Utf8SequenceLength("\xE8"
                               "a"
                               "\xAD"),
            0u);  // interrupted
}

TEST(TerminalColumns, CountsWideZeroAndNarrowCharacters) {
  EXPECT_EQ(TerminalColumns(U'a'), 1);
  EXPECT_EQ(TerminalColumns(U'\u00E9'), 1);      // é
  EXPECT_EQ(TerminalColumns(U'\u2581'), 1);      // ▁, the sparkline's blocks
  EXPECT_EQ(TerminalColumns(U'\u2588'), 1);      // █
  EXPECT_EQ(TerminalColumns(U'\u0301'), 0);      // combining acute accent
  EXPECT_EQ(TerminalColumns(U'\u200D'), 0);      // zero-width joiner
  EXPECT_EQ(TerminalColumns(U'\uFE0F'), 0);      // variation selector 16
  EXPECT_EQ(TerminalColumns(U'\u8BAD'), 2);      // 训
  EXPECT_EQ(TerminalColumns(U'\uAC00'), 2);      // 가
  EXPECT_EQ(TerminalColumns(U'\u3042'), 2);      // あ
  EXPECT_EQ(TerminalColumns(U'\uFF21'), 2);      // full-width A
  EXPECT_EQ(TerminalColumns(U'\U0001F680'), 2);  // rocket
  EXPECT_EQ(TerminalColumns(U'\U00020000'), 2);  // CJK extension B
  EXPECT_EQ(TerminalColumns(U'\u1100'), 2);      // first and last of a range
  EXPECT_EQ(TerminalColumns(U'\u115F'), 2);
  EXPECT_EQ(TerminalColumns(U'\u1160'), 1);  // just past it
}

TEST(DisplayColumns, AddsUpTheCharacters) {
  EXPECT_EQ(DisplayColumns(""), 0u);
  EXPECT_EQ(DisplayColumns("node-1"), 6u);
  EXPECT_EQ(DisplayColumns("\xE8\xAE\xAD\xE7\xBB\x83-1"), 6u);  // 训练-1
  EXPECT_EQ(DisplayColumns("e\xCC\x81"), 1u);  // e + combining acute
  EXPECT_EQ(DisplayColumns("\xFF\xFE"), 2u);   // invalid bytes: one each
}

TEST(CutToColumns, NeverSplitsAWideCharacterAtTheEdge) {
  const std::string text = "\xE8\xAE\xAD\xE7\xBB\x83-1";  // 训练-1
  EXPECT_EQ(CutToColumns(text, 0), "");
  EXPECT_EQ(CutToColumns(text, 1), "");
  EXPECT_EQ(CutToColumns(text, 2), "\xE8\xAE\xAD");
  EXPECT_EQ(CutToColumns(text, 3), "\xE8\xAE\xAD");
  EXPECT_EQ(CutToColumns(text, 4), "\xE8\xAE\xAD\xE7\xBB\x83");
  EXPECT_EQ(CutToColumns(text, 6), text);
  EXPECT_EQ(CutToColumns(text, 60), text);
}

TEST(CutToColumns, KeepsCombiningMarksWithTheirCharacter) {
  EXPECT_EQ(CutToColumns("e\xCC\x81x", 1), "e\xCC\x81");
  EXPECT_EQ(CutToColumns("ab", 1), "a");
}

TEST(CutToColumns, NeverSplitsAnInvalidSequenceOddly) {
  // Invalid bytes are single columns, cut between.
  EXPECT_EQ(CutToColumns("\xFF\xFE\xFD", 2), "\xFF\xFE");
}

}  // namespace
}  // namespace dslaunch::base
