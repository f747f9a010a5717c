#include "agent/horovod_http.h"

#include <arpa/inet.h>  // htonl

#include <cctype>
#include <charconv>
#include <sstream>

namespace dslaunch::agent {

namespace {

bool EqualsNoCase(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (std::tolower(static_cast<unsigned char>(a[i])) !=
        std::tolower(static_cast<unsigned char>(b[i])))
      return false;
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

// A path segment Horovod could have written: visible ASCII, no '/'.
bool IsSegment(std::string_view s) {
  if (s.empty()) return false;
  for (char c : s) {
    if (c <= 0x20 || c >= 0x7f || c == '/') return false;
  }
  return true;
}

HttpRequest Refuse(int status, std::string why) {
  HttpRequest r;
  r.status = status;
  r.why = std::move(why);
  return r;
}

}  // namespace

HttpRequest ParseHorovodRequestHead(std::string_view head) {
  const size_t eol = head.find("\r\n");
  if (eol == std::string_view::npos) return Refuse(400, "no request line");
  std::string_view line = head.substr(0, eol);
  const size_t sp1 = line.find(' ');
  const size_t sp2 =
      sp1 == std::string_view::npos ? sp1 : line.find(' ', sp1 + 1);
  if (sp2 == std::string_view::npos || line.find(' ', sp2 + 1) != line.npos)
    return Refuse(400, "malformed request line");
  HttpRequest r;
  r.method = std::string(line.substr(0, sp1));
  const std::string_view target = line.substr(sp1 + 1, sp2 - sp1 - 1);
  const std::string_view version = line.substr(sp2 + 1);
  if (version != "HTTP/1.1" && version != "HTTP/1.0")
    return Refuse(400, "not HTTP/1.x");
  if (r.method != "GET" && r.method != "PUT" && r.method != "DELETE")
    return Refuse(405, "method " + r.method + " not served");
  // "/scope/key", nothing more: what horovodrun's server takes.
  if (target.size() < 4 || target[0] != '/')
    return Refuse(400, "the path is not /scope/key");
  const size_t slash = target.find('/', 1);
  if (slash == std::string_view::npos)
    return Refuse(400, "the path is not /scope/key");
  const std::string_view scope = target.substr(1, slash - 1);
  const std::string_view key = target.substr(slash + 1);
  if (!IsSegment(scope) || !IsSegment(key))
    return Refuse(400, "the path is not /scope/key");
  r.scope = std::string(scope);
  r.key = std::string(key);

  bool have_length = false;
  size_t pos = eol + 2;
  while (pos < head.size()) {
    const size_t end = head.find("\r\n", pos);
    if (end == std::string_view::npos)
      return Refuse(400, "unterminated header");
    const std::string_view field = head.substr(pos, end - pos);
    pos = end + 2;
    if (field.empty()) break;  // the blank line
    const size_t colon = field.find(':');
    if (colon == std::string_view::npos || colon == 0)
      return Refuse(400, "malformed header");
    const std::string_view name = field.substr(0, colon);
    const std::string_view value = Trim(field.substr(colon + 1));
    if (EqualsNoCase(name, "Transfer-Encoding"))
      return Refuse(501, "Transfer-Encoding is not served");
    if (!EqualsNoCase(name, "Content-Length")) continue;
    size_t n = 0;
    auto [ptr, ec] =
        std::from_chars(value.data(), value.data() + value.size(), n);
    if (value.empty() || ec != std::errc() ||
        ptr != value.data() + value.size())
      return Refuse(400, "bad Content-Length");
    if (have_length && n != r.content_length)
      return Refuse(400, "two Content-Lengths");
    have_length = true;
    r.content_length = n;
  }
  if (r.content_length > kHorovodMaxBodyBytes) {
    return Refuse(413, "a value of " + std::to_string(r.content_length) +
                           " bytes; at most " +
                           std::to_string(kHorovodMaxBodyBytes));
  }
  if (r.method == "PUT" && !have_length)
    return Refuse(411, "PUT without Content-Length");
  return r;
}

StatusOr<uid_t> LoopbackPeerUid(std::string_view table, uint16_t local_port,
                                uint16_t peer_port) {
  // "sl local_address rem_address st tx:rx tr:when retrnsmt uid ...", the
  // addresses as the kernel holds them (network order) printed as hex.
  const uint32_t loopback = htonl(INADDR_LOOPBACK);
  auto endpoint = [&](std::string_view s, uint16_t port) {
    uint32_t addr = 0;
    unsigned p = 0;
    const size_t colon = s.find(':');
    if (colon != 8 || s.size() != 13) return false;
    auto a = std::from_chars(s.data(), s.data() + 8, addr, 16);
    auto b = std::from_chars(s.data() + 9, s.data() + 13, p, 16);
    return a.ec == std::errc() && b.ec == std::errc() && addr == loopback &&
           p == port;
  };
  std::istringstream lines{std::string(table)};
  std::string line;
  std::getline(lines, line);  // the column names
  while (std::getline(lines, line)) {
    std::istringstream fields(line);
    std::string sl, local, remote, st, queues, timer, retransmits, uid;
    if (!(fields >> sl >> local >> remote >> st >> queues >> timer >>
          retransmits >> uid))
      continue;
    if (!endpoint(local, peer_port) || !endpoint(remote, local_port)) continue;
    uid_t value = 0;
    auto [ptr, ec] =
        std::from_chars(uid.data(), uid.data() + uid.size(), value);
    if (ec != std::errc() || ptr != uid.data() + uid.size()) continue;
    return value;
  }
  return NotFound("no socket 127.0.0.1:" + std::to_string(peer_port) +
                  " -> 127.0.0.1:" + std::to_string(local_port));
}

}  // namespace dslaunch::agent
