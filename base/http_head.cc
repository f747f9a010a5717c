#include "base/http_head.h"

#include <cctype>

namespace dslaunch::base {
namespace {

// A token (RFC 9110): visible ASCII but separators' ':' and '"'.
bool IsToken(std::string_view s) {
  if (s.empty()) return false;
  for (char c : s) {
    if (c <= ' ' || c >= 0x7f || c == ':' || c == '"') return false;
  }
  return true;
}

std::string_view Trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t'))
    s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t'))
    s.remove_suffix(1);
  return s;
}

}  // namespace

bool EqualsNoCase(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (std::tolower(static_cast<unsigned char>(a[i])) !=
        std::tolower(static_cast<unsigned char>(b[i])))
      return false;
  }
  return true;
}

std::optional<HttpRequestHead> ParseHttpRequestHead(std::string_view head) {
  HttpRequestHead out;
  bool first = true;
  while (!head.empty()) {
    const size_t eol = head.find('\n');
    std::string_view line = head.substr(0, eol);
    head = eol == std::string_view::npos ? std::string_view()
                                         : head.substr(eol + 1);
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (first) {
      first = false;
      const size_t sp1 = line.find(' ');
      const size_t sp2 =
          sp1 == std::string_view::npos ? sp1 : line.find(' ', sp1 + 1);
      if (sp2 == std::string_view::npos ||
          line.find(' ', sp2 + 1) != std::string_view::npos)
        return std::nullopt;
      out.method = line.substr(0, sp1);
      out.target = line.substr(sp1 + 1, sp2 - sp1 - 1);
      const std::string_view version = line.substr(sp2 + 1);
      if (!IsToken(out.method) || out.target.empty() || out.target[0] != '/' ||
          (version != "HTTP/1.0" && version != "HTTP/1.1"))
        return std::nullopt;
      continue;
    }
    if (line.empty()) continue;  // the blank line(s) ending the head
    const size_t colon = line.find(':');
    if (colon == std::string_view::npos || !IsToken(line.substr(0, colon)))
      return std::nullopt;
    out.fields.emplace_back(line.substr(0, colon),
                            Trim(line.substr(colon + 1)));
  }
  if (first) return std::nullopt;  // no request line at all
  return out;
}

const char* HttpReason(int code) {
  switch (code) {
    case 200:
      return "OK";
    case 400:
      return "Bad Request";
    case 403:
      return "Forbidden";
    case 404:
      return "Not Found";
    case 405:
      return "Method Not Allowed";
    case 408:
      return "Request Timeout";
    case 411:
      return "Length Required";
    case 413:
      return "Content Too Large";
    case 431:
      return "Request Header Fields Too Large";
    case 501:
      return "Not Implemented";
    case 503:
      return "Service Unavailable";
    default:
      return "Internal Server Error";
  }
}

std::string HttpResponseHead(int code, size_t content_length,
                             std::string_view fields) {
  std::string r = "HTTP/1.1 " + std::to_string(code) + " " + HttpReason(code);
  r.append("\r\n").append(fields);
  r.append("Content-Length: ").append(std::to_string(content_length));
  r.append("\r\nConnection: close\r\n\r\n");
  return r;
}

}  // namespace dslaunch::base
