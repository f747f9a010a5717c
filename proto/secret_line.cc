#include "proto/secret_line.h"

#include <charconv>

namespace dslaunch::proto {

static constexpr size_t kSecretHexDigits = 64;
static constexpr int kMaxNodeRank = 65535;

std::string SecretLine(int node_rank, std::string_view secret_hex) {
  return std::string(kSecretLineTag) + std::to_string(node_rank) + " " +
         std::string(secret_hex);
}

bool HasSecretTag(std::string_view line) {
  return line.find(kSecretLineTag) != std::string_view::npos;
}

static bool IsLowerHex(std::string_view s) {
  for (char c : s) {
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  }
  return true;
}

StatusOr<AgentSecret> ParseSecretLine(std::string_view line) {
  const size_t tag = line.find(kSecretLineTag);
  if (tag == std::string_view::npos)
    return InvalidArgument("not a secret line");
  std::string_view rest = line.substr(tag + kSecretLineTag.size());
  const size_t space = rest.find(' ');
  if (space == std::string_view::npos || space == 0 || space > 5)
    return InvalidArgument("a secret line without a node rank");
  AgentSecret out;
  const char* end = rest.data() + space;
  auto [ptr, ec] = std::from_chars(rest.data(), end, out.node_rank);
  if (ec != std::errc() || ptr != end || out.node_rank < 0 ||
      out.node_rank > kMaxNodeRank)
    return InvalidArgument("a secret line with a bad node rank");
  rest = rest.substr(space + 1);
  while (!rest.empty() && (rest.back() == '\r' || rest.back() == ' '))
    rest.remove_suffix(1);
  if (rest.size() != kSecretHexDigits || !IsLowerHex(rest))
    return InvalidArgument("a secret line whose secret is not 64 hex digits");
  out.secret = std::string(rest);
  return out;
}

}  // namespace dslaunch::proto
