#include "agent/horovod_http.h"

#include <arpa/inet.h>  // htonl

#include <charconv>
#include <sstream>

#include "base/http_head.h"

namespace dslaunch::agent {

namespace {

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

HttpRequest ParseHorovodRequestHead(std::string_view text) {
  const auto head = base::ParseHttpRequestHead(text);
  if (!head) return Refuse(400, "a malformed request head");
  HttpRequest r;
  r.method = std::string(head->method);
  if (r.method != "GET" && r.method != "PUT" && r.method != "DELETE")
    return Refuse(405, "method " + r.method + " not served");
  // "/scope/key", nothing more: what horovodrun's server takes.
  const std::string_view target = head->target;
  const size_t slash = target.find('/', 1);
  if (slash == std::string_view::npos ||
      !IsSegment(target.substr(1, slash - 1)) ||
      !IsSegment(target.substr(slash + 1)))
    return Refuse(400, "the path is not /scope/key");
  r.scope = std::string(target.substr(1, slash - 1));
  r.key = std::string(target.substr(slash + 1));

  bool have_length = false;
  for (const auto& [name, value] : head->fields) {
    if (base::EqualsNoCase(name, "Transfer-Encoding"))
      return Refuse(501, "Transfer-Encoding is not served");
    if (!base::EqualsNoCase(name, "Content-Length")) continue;
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
