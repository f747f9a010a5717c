#include "proto/progress.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <nlohmann/json.hpp>
#include <string>

namespace dslaunch::proto {
namespace {

TEST(ValidateProgressRecord, AcceptsJsonObjects) {
  EXPECT_TRUE(ValidateProgressRecord("{}").ok());
  EXPECT_TRUE(ValidateProgressRecord(
                  R"({"step": 10, "loss": 2.31, "tokens_per_s": 51200})")
                  .ok());
  EXPECT_TRUE(ValidateProgressRecord(R"(  {"nested": {"a": [1, 2]}}  )").ok());
}

TEST(ValidateProgressRecord, RejectsArraysNumbersAndOtherScalars) {
  for (const char* line :
       {"[]", "[1, 2]", "42", "2.5", "\"text\"", "true", "null"}) {
    Status st = ValidateProgressRecord(line);
    EXPECT_EQ(st.code(), StatusCode::kDataError) << line;
  }
}

TEST(ValidateProgressRecord, RejectsGarbage) {
  for (const char* line : {"", "step=10", "{", "{\"step\": }", "{} {}",
                           "{\"a\": 1} trailing", "\xff\xfe{}"}) {
    Status st = ValidateProgressRecord(line);
    EXPECT_EQ(st.code(), StatusCode::kDataError) << line;
  }
}

TEST(ValidateProgressRecord, AcceptsRecordOfExactlyTheLimit) {
  const std::string prefix = R"({"pad": ")";
  const std::string suffix = R"("})";
  const std::string line =
      prefix +
      std::string(kMaxProgressRecordBytes - prefix.size() - suffix.size(),
                  'x') +
      suffix;
  ASSERT_EQ(line.size(), kMaxProgressRecordBytes);
  EXPECT_TRUE(ValidateProgressRecord(line).ok());
}

TEST(ValidateProgressRecord, RejectsOversizedRecordEvenIfValidJson) {
  const std::string line =
      R"({"pad": ")" + std::string(kMaxProgressRecordBytes, 'x') + R"("})";
  Status st = ValidateProgressRecord(line);
  EXPECT_EQ(st.code(), StatusCode::kDataError);
  EXPECT_NE(st.message().find("limit"), std::string::npos) << st.message();
}

TEST(AnnotateProgressRecord, AddsRankNodeAndTime) {
  const std::string out = AnnotateProgressRecord(R"({"step": 10, "loss": 2.5})",
                                                 3, "node-b", 12.25);
  EXPECT_EQ(out.find('\n'), std::string::npos);
  auto json = nlohmann::json::parse(out);
  EXPECT_EQ(json["step"], 10);
  EXPECT_EQ(json["loss"], 2.5);
  EXPECT_EQ(json["rank"], 3);
  EXPECT_EQ(json["node"], "node-b");
  EXPECT_EQ(json["time"], 12.25);
}

TEST(AnnotateProgressRecord, OverwritesFieldsTheRankSentItself) {
  const std::string out = AnnotateProgressRecord(
      R"({"rank": 99, "node": "fake", "time": 1, "step": 1})", 4, "node-c",
      100.5);
  auto json = nlohmann::json::parse(out);
  EXPECT_EQ(json["rank"], 4);
  EXPECT_EQ(json["node"], "node-c");
  EXPECT_EQ(json["time"], 100.5);
  EXPECT_EQ(json["step"], 1);
}

TEST(AnnotateProgressRecord, KeepsTheRanksFieldOrderAndAppendsAnnotations) {
  EXPECT_EQ(
      AnnotateProgressRecord(R"({"step": 3, "loss": 2.5, "acc": 0.5})", 1, "n0",
                             1.5),
      R"({"step":3,"loss":2.5,"acc":0.5,"rank":1,"node":"n0","time":1.5})");
}

TEST(AnnotateProgressRecord, WritesFloatsInTheirShortestForm) {
  // dsworker writes %.9g; nlohmann's dump() would write 17 digits back.
  EXPECT_EQ(
      AnnotateProgressRecord(
          R"({"loss": 5.46473217, "lr": 0.00095, "big": 1e300, "whole": 2.0,
                    "n": 7, "nested": {"a": [0.1, "x\u00e9", null, true]}})",
          0, "n0", 1795856657.4774613),
      R"({"loss":5.46473217,"lr":0.00095,"big":1e+300,"whole":2.0,"n":7,)"
      R"("nested":{"a":[0.1,"x)"
      "\xc3\xa9"
      R"(",null,true]},"rank":0,"node":"n0","time":1795856657.4774613})");
}

TEST(DumpJson, ReadsBackTheSameNumbersAsDump) {
  for (double d : {0.1, 1.0 / 3, 6.02214076e23, -2.5e-12, 5e-324, 1e308, 0.0,
                   -0.0, 123456789012.0}) {
    nlohmann::ordered_json v = {{"x", d}};
    const auto back = nlohmann::json::parse(DumpJson(v));
    EXPECT_EQ(back["x"].get<double>(), d) << DumpJson(v);
    EXPECT_TRUE(back["x"].is_number_float()) << DumpJson(v);
  }
  nlohmann::ordered_json odd = {
      {"inf", std::numeric_limits<double>::infinity()},
      {"bad", std::string("\xff")}};
  EXPECT_EQ(DumpJson(odd),
            odd.dump(-1, ' ', false,
                     nlohmann::ordered_json::error_handler_t::replace));
}

TEST(AnnotateProgressRecord, StaysOneLineForRecordsWithNewlinesInStrings) {
  const std::string out =
      AnnotateProgressRecord(R"({"msg": "a\nb"})", 0, "n", 1.0);
  EXPECT_EQ(out.find('\n'), std::string::npos);
  EXPECT_EQ(nlohmann::json::parse(out)["msg"], "a\nb");
}

TEST(AnnotateProgressRecord, TurnsNonObjectIntoAnnotatedObject) {
  auto json = nlohmann::json::parse(AnnotateProgressRecord("[1]", 1, "n", 2.0));
  ASSERT_TRUE(json.is_object());
  EXPECT_EQ(json["rank"], 1);
}

TEST(ValidateProgressRecord, RejectsNestingDeeperThanTheLimitWithoutRecursing) {
  const std::string arrays =
      "{\"a\":" + std::string(100000, '[') + std::string(100000, ']') + "}";
  EXPECT_EQ(ValidateProgressRecord(arrays).code(), StatusCode::kDataError);
  std::string objects;
  for (int i = 0; i < 10000; ++i) objects += "{\"a\":";
  objects += "1" + std::string(10000, '}');
  Status st = ValidateProgressRecord(objects);
  EXPECT_EQ(st.code(), StatusCode::kDataError);
  EXPECT_NE(st.message().find("deeper than 32"), std::string::npos)
      << st.message();
}

TEST(ValidateProgressRecord, AcceptsNestingUpToTheLimit) {
  std::string ok = "{\"a\":" + std::string(kMaxProgressDepth - 1, '[') +
                   std::string(kMaxProgressDepth - 1, ']') + "}";
  EXPECT_TRUE(ValidateProgressRecord(ok).ok());
  std::string deep = "{\"a\":" + std::string(kMaxProgressDepth, '[') +
                     std::string(kMaxProgressDepth, ']') + "}";
  EXPECT_FALSE(ValidateProgressRecord(deep).ok());
}

TEST(CheckJsonNesting, IgnoresBracketsInsideStrings) {
  const std::string quoted = "{\"s\": \"" + std::string(1000, '[') +
                             "\\\"[[[\"}";  // an escaped quote inside
  EXPECT_TRUE(CheckJsonNesting(quoted, 2).ok());
  EXPECT_TRUE(ValidateProgressRecord(quoted).ok());
  EXPECT_FALSE(CheckJsonNesting("[[[]]]", 2).ok());
  EXPECT_TRUE(CheckJsonNesting("[[]][[]]", 2).ok());
}

TEST(AnnotateProgressRecord, ReplacesATooDeepRecordInsteadOfCrashing) {
  const std::string deep =
      "{\"a\":" + std::string(200000, '[') + std::string(200000, ']') + "}";
  EXPECT_EQ(AnnotateProgressRecord(deep, 1, "n", 2.0),
            R"({"rank":1,"node":"n","time":2.0})");
}

TEST(EscapeControlChars, EscapesC0DelAndC1ButNotTabOrText) {
  EXPECT_EQ(EscapeControlChars("\x1b[2Jplain\ttab"), "\\u001b[2Jplain\ttab");
  EXPECT_EQ(EscapeControlChars(std::string("a\0b\r\n\x7f", 6)),
            "a\\u0000b\\u000d\\u000a\\u007f");
  EXPECT_EQ(EscapeControlChars("\xc2\x9b"
                               "31m"),
            "\\u009b31m");  // C1 CSI
  EXPECT_EQ(EscapeControlChars("\xc2\x85"), "\\u0085");
  EXPECT_EQ(
      EscapeControlChars("caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80 \xc2\xa0"),
      "caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80 \xc2\xa0");
  // Bytes that are not UTF-8 (a raw 8-bit CSI among them) are escaped too.
  EXPECT_EQ(EscapeControlChars("\x9b"
                               "1m\xff\xe2\x82"),
            "\\x9b1m\\xff\\xe2\\x82");
}

// "Trojan Source": bidirectional overrides and isolates reorder what a
// reader sees; the Unicode line separators start a new line in some viewers.
TEST(EscapeControlChars, EscapesBidiControlsAndLineSeparators) {
  EXPECT_EQ(EscapeControlChars("user\xe2\x80\xae"
                               "txt.exe"),
            "user\\u202etxt.exe");  // RIGHT-TO-LEFT OVERRIDE
  EXPECT_EQ(
      EscapeControlChars("\xe2\x80\xaa\xe2\x80\xab\xe2\x80\xac\xe2\x80\xad"),
      "\\u202a\\u202b\\u202c\\u202d");
  EXPECT_EQ(
      EscapeControlChars("\xe2\x81\xa6\xe2\x81\xa7\xe2\x81\xa8\xe2\x81\xa9"),
      "\\u2066\\u2067\\u2068\\u2069");  // isolates
  EXPECT_EQ(EscapeControlChars("\xe2\x80\x8e\xe2\x80\x8f\xd8\x9c"),
            "\\u200e\\u200f\\u061c");  // LRM, RLM, ARABIC LETTER MARK
  EXPECT_EQ(EscapeControlChars("a\xe2\x80\xa8"
                               "b\xe2\x80\xa9"),
            "a\\u2028b\\u2029");
  // Their neighbours stay text: en dash, narrow no-break space, Arabic.
  EXPECT_EQ(EscapeControlChars("\xe2\x80\x93\xe2\x80\xaf\xd8\xa8"),
            "\xe2\x80\x93\xe2\x80\xaf\xd8\xa8");
}

// Invisible characters: a name holding them looks like another.
TEST(EscapeControlChars, EscapesZeroWidthAndHiddenCharacters) {
  EXPECT_EQ(EscapeControlChars("a\xe2\x80\x8b"
                               "b\xe2\x81\xa0"
                               "c\xef\xbb\xbf"),
            "a\\u200bb\\u2060c\\ufeff");
  EXPECT_EQ(EscapeControlChars("\xef\xbf\xb9x\xef\xbf\xbb"), "\\ufff9x\\ufffb");
  // Tag characters carry hidden ASCII ("A" = U+E0041).
  EXPECT_EQ(EscapeControlChars("ok\xf3\xa0\x81\x81"), "ok\\U000e0041");
  // In rank output the emoji sequences keep their joiner and selector.
  EXPECT_EQ(EscapeControlChars("\xe2\x9d\xa4\xef\xb8\x8f"
                               "\xf0\x9f\x91\xa8\xe2\x80\x8d\xf0\x9f\x91\xa9"),
            "\xe2\x9d\xa4\xef\xb8\x8f"
            "\xf0\x9f\x91\xa8\xe2\x80\x8d\xf0\x9f\x91\xa9");
}

TEST(EscapeForLog, EscapesWhatMakesTwoNamesLookAlike) {
  EXPECT_EQ(EscapeForLog("node\xe2\x80\x8d"
                         "1\xc2\xad"
                         "x\xe3\x85\xa4"),
            "node\\u200d1\\u00adx\\u3164");
  EXPECT_EQ(EscapeForLog("n\xef\xb8\x8f"), "n\\ufe0f");
}

TEST(EscapeForLog, CutsLongTextAtACharacterBoundaryAndSaysHowMuchWasLeft) {
  EXPECT_EQ(EscapeForLog("short\x1b", 200), "short\\u001b");
  EXPECT_EQ(EscapeForLog(std::string(300, 'x'), 10),
            "xxxxxxxxxx...(290 more bytes)");
  // "é" is two bytes: a cut inside it backs up to before it.
  EXPECT_EQ(EscapeForLog("abc\xc3\xa9"
                         "def",
                         4),
            "abc...(5 more bytes)");
  EXPECT_EQ(EscapeForLog("\x1b\x1b\x1b", 2), "\\u001b\\u001b...(1 more bytes)");
  // Continuation bytes alone: the cut backs up 3 at most, never to nothing.
  EXPECT_EQ(EscapeForLog(std::string(300, '\x80'), 10),
            "\\x80\\x80\\x80\\x80\\x80\\x80\\x80...(293 more bytes)");
}

TEST(ProgressClient, ReportWithoutConnectFails) {
  ProgressClient client;
  EXPECT_EQ(client.Report("{}").code(), StatusCode::kUnavailable);
}

TEST(ProgressClient, ConnectToMissingSocketFails) {
  ProgressClient client;
  EXPECT_FALSE(client.Connect("/nonexistent-dir-dslaunch/progress.sock").ok());
  EXPECT_FALSE(client.Connect("").ok());
  EXPECT_FALSE(client.Connect("/" + std::string(200, 'x')).ok());
}

}  // namespace
}  // namespace dslaunch::proto

namespace dslaunch::proto {
namespace {

TEST(NormalizeNonFinite, TurnsPythonsAndCsNonFiniteWordsIntoStrings) {
  EXPECT_EQ(NormalizeNonFinite(R"({"step": 5, "loss": NaN})"),
            R"({"step": 5, "loss": "NaN"})");
  EXPECT_EQ(NormalizeNonFinite(R"({"a": Infinity, "b": -Infinity})"),
            R"({"a": "Infinity", "b": "-Infinity"})");
  EXPECT_EQ(
      NormalizeNonFinite(R"({"loss": nan, "g": -nan, "x": inf, "y": -inf})"),
      R"({"loss": "NaN", "g": "NaN", "x": "Infinity", "y": "-Infinity"})");
  EXPECT_TRUE(
      ValidateProgressRecord(NormalizeNonFinite(R"({"step": 5, "loss": NaN})"))
          .ok());
}

TEST(NormalizeNonFinite, LeavesStringsLiteralsAndNumbersAlone) {
  for (const char* line :
       {R"({"note": "loss is NaN, -inf or nan", "ok": true, "n": null})",
        R"({"e": 1e5, "f": -2.5E-3, "s": "a\"NaN\"b"})", R"({"NaNa": 1})",
        R"({"x": Nana})", "", "NaN"}) {
    const std::string s(line);
    if (s == "NaN") continue;  // a bare word alone is replaced (below)
    EXPECT_EQ(NormalizeNonFinite(s), s) << s;
  }
  EXPECT_EQ(NormalizeNonFinite("NaN"), "\"NaN\"");
}

TEST(NonFiniteValue, ReadsBackOnlyTheNormalizedStrings) {
  EXPECT_TRUE(std::isnan(*NonFiniteValue("NaN")));
  EXPECT_EQ(*NonFiniteValue("Infinity"),
            std::numeric_limits<double>::infinity());
  EXPECT_EQ(*NonFiniteValue("-Infinity"),
            -std::numeric_limits<double>::infinity());
  EXPECT_FALSE(NonFiniteValue("nan").has_value());
  EXPECT_FALSE(NonFiniteValue("1.5").has_value());
}

}  // namespace
}  // namespace dslaunch::proto
