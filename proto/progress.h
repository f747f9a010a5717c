// The progress protocol: a rank connects to the Unix socket named by
// DSLAUNCH_PROGRESS and writes newline-terminated JSON objects. This file
// holds the record checks (agent and launcher side: size and nesting are
// bounded before anything recursive touches a record), the annotation the
// launcher adds before writing metrics.jsonl, the escaping of rank-supplied
// text for the terminal, and a small blocking client for ranks written in
// C++. Pure functions; ProgressClient is single-threaded.
#pragma once

#include <nlohmann/json_fwd.hpp>
#include <optional>
#include <string>
#include <string_view>

#include "base/status.h"

namespace dslaunch::proto {

inline constexpr size_t kMaxProgressRecordBytes = 64 * 1024;
// Arrays and objects nested deeper than this make a record malformed: the
// JSON library prints (and compares) recursively, so depth is bounded first.
inline constexpr int kMaxProgressDepth = 32;

// OK when the arrays and objects of `json` nest at most `max_depth` deep.
// A linear scan (strings skipped, no recursion); it does not check syntax.
Status CheckJsonNesting(std::string_view json, int max_depth);
// Training that diverged writes non-finite numbers, which JSON has no words
// for: Python's json.dumps writes NaN, Infinity and -Infinity, C's printf
// nan, -nan, inf and -inf. Outside strings, each such bare word becomes the
// string "NaN", "Infinity" or "-Infinity", so the record stays valid JSON
// and keeps its step (a dropped record would look like a hang). Returns
// `line` unchanged when there is none.
std::string NormalizeNonFinite(std::string_view line);
// The number a normalized non-finite value stands for, if `text` is one.
std::optional<double> NonFiniteValue(std::string_view text);
// OK when `line` is one JSON object of at most kMaxProgressRecordBytes and
// kMaxProgressDepth levels.
Status ValidateProgressRecord(std::string_view line);
// Returns the record with "rank", "node" and "time" set (overwriting any the
// rank sent itself), serialized on one line. A record that is not an object,
// or too large or deep, becomes an object holding only those three.
std::string AnnotateProgressRecord(std::string_view json, int rank,
                                   const std::string& node, double time);
// `value` serialized on one line as nlohmann's dump() does, but for floats
// in their shortest form that reads back the same ("5.46473217", where
// dump() writes 17 digits: "5.4647321700000004"); a whole float keeps
// ".0". Invalid UTF-8 is replaced. REQUIRES: nesting already bounded.
std::string DumpJson(const nlohmann::ordered_json& value);
// Rank-supplied text made safe for a terminal: C0 controls except tab, DEL,
// C1 controls (U+0080..U+009F, or such bytes outside valid UTF-8), the
// bidirectional controls that reorder what a reader sees (U+061C, U+200E,
// U+200F, U+202A..U+202E, U+2066..U+206F), the line and paragraph
// separators (U+2028, U+2029), zero-width spaces and invisible operators
// (U+200B, U+200C, U+2060..U+2064), the byte order mark, interlinear
// annotations (U+FFF9..U+FFFB) and tag characters (U+E0000..U+E007F) are
// written as \u001b-style escapes (\U000e0041 beyond U+FFFF), so no escape
// sequence, forged line, reordered or hidden text reaches the screen.
std::string EscapeControlChars(std::string_view text);
// Text a peer sent (a hostname, a version, a reason) made fit for one log
// line: escaped as by EscapeControlChars plus what makes two names look
// alike (U+200D and the variation selectors emoji use, the soft hyphen,
// U+034F, the Mongolian selectors, the Hangul fillers) and, when longer than
// `max_bytes`, cut there (at a character boundary, at most 3 bytes before)
// and marked "...(N more bytes)".
std::string EscapeForLog(std::string_view text, size_t max_bytes = 200);

class ProgressClient {
 public:
  ProgressClient() = default;
  ~ProgressClient();
  ProgressClient(const ProgressClient&) = delete;
  ProgressClient& operator=(const ProgressClient&) = delete;

  // Connects to `path` (usually getenv("DSLAUNCH_PROGRESS")).
  Status Connect(const std::string& path);
  // Sends one record; `json` must not contain a newline.
  Status Report(std::string_view json);

 private:
  int fd_ = -1;
};

}  // namespace dslaunch::proto
