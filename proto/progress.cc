#include "proto/progress.h"

#include <unistd.h>  // close

#include <charconv>  // to_chars: shortest floats
#include <cmath>     // isfinite
#include <cstdio>    // snprintf for escapes
#include <limits>
#include <nlohmann/json.hpp>  // parsing and re-serializing records

#include "base/unix_socket.h"
#include "base/utf8.h"

namespace dslaunch::proto {

Status CheckJsonNesting(std::string_view json, int max_depth) {
  int depth = 0;
  bool in_string = false;
  for (size_t i = 0; i < json.size(); ++i) {
    const char c = json[i];
    if (in_string) {
      if (c == '\\') {
        ++i;  // the escaped character cannot end the string
      } else if (c == '"') {
        in_string = false;
      }
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      if (++depth > max_depth) {
        return DataError("progress record nests deeper than " +
                         std::to_string(max_depth) + " levels");
      }
    } else if (c == ']' || c == '}') {
      --depth;
    }
  }
  return Status::Ok();
}

namespace {

// The JSON string for a bare non-finite word, or nullptr.
const char* NonFiniteWord(std::string_view word) {
  if (word == "NaN" || word == "nan" || word == "-nan" || word == "-NaN")
    return "\"NaN\"";
  if (word == "Infinity" || word == "inf") return "\"Infinity\"";
  if (word == "-Infinity" || word == "-inf") return "\"-Infinity\"";
  return nullptr;
}

bool WordChar(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
}

}  // namespace

std::string NormalizeNonFinite(std::string_view line) {
  std::string out;
  size_t copied = 0;
  bool in_string = false;
  for (size_t i = 0; i < line.size(); ++i) {
    const char c = line[i];
    if (in_string) {
      if (c == '\\') {
        ++i;
      } else if (c == '"') {
        in_string = false;
      }
      continue;
    }
    if (c == '"') {
      in_string = true;
      continue;
    }
    const bool minus = c == '-' && i + 1 < line.size() && WordChar(line[i + 1]);
    if (!minus && !WordChar(c)) continue;
    size_t end = i + (minus ? 1 : 0);
    while (end < line.size() && WordChar(line[end])) ++end;
    if (const char* json = NonFiniteWord(line.substr(i, end - i))) {
      out.append(line.substr(copied, i - copied));
      out.append(json);
      copied = end;
    }
    i = end - 1;
  }
  if (copied == 0) return std::string(line);
  out.append(line.substr(copied));
  return out;
}

std::optional<double> NonFiniteValue(std::string_view text) {
  if (text == "NaN") return std::numeric_limits<double>::quiet_NaN();
  if (text == "Infinity") return std::numeric_limits<double>::infinity();
  if (text == "-Infinity") return -std::numeric_limits<double>::infinity();
  return std::nullopt;
}

Status ValidateProgressRecord(std::string_view line) {
  if (line.size() > kMaxProgressRecordBytes) {
    return DataError("progress record of " + std::to_string(line.size()) +
                     " bytes (limit " +
                     std::to_string(kMaxProgressRecordBytes) + ")");
  }
  RETURN_IF_ERROR(CheckJsonNesting(line, kMaxProgressDepth));
  auto parsed =
      nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
  if (parsed.is_discarded()) return DataError("progress record is not JSON");
  if (!parsed.is_object()) {
    return DataError("progress record is not a JSON object");
  }
  return Status::Ok();
}

std::string AnnotateProgressRecord(std::string_view json, int rank,
                                   const std::string& node, double time) {
  nlohmann::ordered_json record;
  if (json.size() <= kMaxProgressRecordBytes &&
      CheckJsonNesting(json, kMaxProgressDepth).ok()) {
    record = nlohmann::ordered_json::parse(json, nullptr, false);
  }
  if (!record.is_object()) record = nlohmann::ordered_json::object();
  record["rank"] = rank;
  record["node"] = node;
  record["time"] = time;
  return DumpJson(record);
}

namespace {

void AppendJson(const nlohmann::ordered_json& v, std::string* out) {
  using Type = nlohmann::ordered_json::value_t;
  const auto dump = [](const nlohmann::ordered_json& x) {
    return x.dump(-1, ' ', false,
                  nlohmann::ordered_json::error_handler_t::replace);
  };
  switch (v.type()) {
    case Type::object: {
      out->push_back('{');
      bool first = true;
      for (const auto& [key, item] : v.items()) {
        if (!first) out->push_back(',');
        first = false;
        *out += dump(nlohmann::ordered_json(key));
        out->push_back(':');
        AppendJson(item, out);
      }
      out->push_back('}');
      return;
    }
    case Type::array: {
      out->push_back('[');
      for (size_t i = 0; i < v.size(); ++i) {
        if (i > 0) out->push_back(',');
        AppendJson(v[i], out);
      }
      out->push_back(']');
      return;
    }
    case Type::number_float: {
      const double d = v.get<double>();
      if (!std::isfinite(d)) {
        *out += "null";  // as dump() writes it
        return;
      }
      char buf[32];
      const auto res = std::to_chars(buf, buf + sizeof buf, d);
      const std::string_view text(buf, static_cast<size_t>(res.ptr - buf));
      *out += text;
      if (text.find_first_of(".e") == std::string_view::npos) *out += ".0";
      return;
    }
    default:
      *out += dump(v);
  }
}

}  // namespace

std::string DumpJson(const nlohmann::ordered_json& value) {
  std::string out;
  AppendJson(value, &out);
  return out;
}

namespace {

// The code point of one valid UTF-8 sequence of 2 to 4 bytes.
unsigned DecodeUtf8(std::string_view seq) {
  const auto b = [&](size_t i) { return static_cast<unsigned char>(seq[i]); };
  if (seq.size() == 2) return (b(0) & 0x1Fu) << 6 | (b(1) & 0x3Fu);
  if (seq.size() == 3)
    return (b(0) & 0x0Fu) << 12 | (b(1) & 0x3Fu) << 6 | (b(2) & 0x3Fu);
  return (b(0) & 0x07u) << 18 | (b(1) & 0x3Fu) << 12 | (b(2) & 0x3Fu) << 6 |
         (b(3) & 0x3Fu);
}

// Characters that change what a reader sees without showing themselves:
// bidirectional controls ("Trojan Source" reordering), the Unicode line and
// paragraph separators (a new line to some viewers), zero-width spaces and
// invisible operators, the byte order mark, interlinear annotations and the
// tag characters (hidden text). `strict` (text naming something: a host, a
// version) adds the joiners and variation selectors that emoji sequences
// use, the soft hyphen and the fillers that render as blanks, so two names
// that look alike are told apart.
bool IsInvisible(unsigned cp, bool strict) {
  if (cp == 0x061C || (cp >= 0x200B && cp <= 0x200C) ||
      (cp >= 0x200E && cp <= 0x200F) || (cp >= 0x2028 && cp <= 0x202E) ||
      (cp >= 0x2060 && cp <= 0x2064) || (cp >= 0x2066 && cp <= 0x206F) ||
      cp == 0xFEFF || (cp >= 0xFFF9 && cp <= 0xFFFB) ||
      (cp >= 0xE0000 && cp <= 0xE007F))
    return true;
  return strict &&
         (cp == 0x00AD || cp == 0x034F || cp == 0x115F || cp == 0x1160 ||
          (cp >= 0x180B && cp <= 0x180F) || cp == 0x200D || cp == 0x3164 ||
          (cp >= 0xFE00 && cp <= 0xFE0F) || cp == 0xFFA0);
}

std::string Escape(std::string_view text, bool strict) {
  std::string out;
  out.reserve(text.size());
  char buf[16];
  while (!text.empty()) {
    const auto c = static_cast<unsigned char>(text[0]);
    size_t n = c < 0x80 ? 1 : base::Utf8SequenceLength(text);  // ASCII inline
    unsigned cp = 0;
    if ((c < 0x20 && c != '\t') || c == 0x7F) {
      std::snprintf(buf, sizeof(buf), "\\u%04x", c);
      out += buf;
    } else if (n == 2 && c == 0xC2 &&
               static_cast<unsigned char>(text[1]) < 0xA0) {
      std::snprintf(buf, sizeof(buf), "\\u%04x",
                    static_cast<unsigned char>(text[1]));  // C1: U+0080..9F
      out += buf;
    } else if (n > 1 &&
               IsInvisible(cp = DecodeUtf8(text.substr(0, n)), strict)) {
      std::snprintf(buf, sizeof(buf), cp > 0xFFFF ? "\\U%08x" : "\\u%04x", cp);
      out += buf;
    } else if (n == 0) {
      std::snprintf(buf, sizeof(buf), "\\x%02x", c);  // not UTF-8
      out += buf;
      n = 1;
    } else {
      out.append(text.substr(0, n));
    }
    text.remove_prefix(n);
  }
  return out;
}

}  // namespace

std::string EscapeForLog(std::string_view text, size_t max_bytes) {
  if (text.size() <= max_bytes) return Escape(text, /*strict=*/true);
  size_t cut = max_bytes;
  // Back to a character boundary (a UTF-8 sequence is at most 4 bytes):
  // never half a sequence, and never more than 3 bytes back, whatever
  // continuation bytes a peer sent.
  for (int back = 0; back < 3 && cut > 0 &&
                     (static_cast<unsigned char>(text[cut]) & 0xC0) == 0x80;
       ++back)
    --cut;
  return Escape(text.substr(0, cut), /*strict=*/true) + "...(" +
         std::to_string(text.size() - cut) + " more bytes)";
}

std::string EscapeControlChars(std::string_view text) {
  return Escape(text, /*strict=*/false);
}

ProgressClient::~ProgressClient() {
  if (fd_ >= 0) ::close(fd_);
}

Status ProgressClient::Connect(const std::string& path) {
  ASSIGN_OR_RETURN(fd_, base::ConnectUnixSocket(path));
  return Status::Ok();
}

Status ProgressClient::Report(std::string_view json) {
  if (fd_ < 0) return Unavailable("progress client is not connected");
  std::string line(json);
  line.push_back('\n');
  return base::WriteAll(fd_, line);
}

}  // namespace dslaunch::proto
