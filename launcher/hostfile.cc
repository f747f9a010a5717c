#include "launcher/hostfile.h"

#include <fcntl.h>   // open
#include <unistd.h>  // read, close

#include <algorithm>      // all_of
#include <cctype>         // isalnum, tolower
#include <cerrno>         // errno, EINTR
#include <charconv>       // from_chars
#include <cstring>        // strerror
#include <set>            // keys seen on a line
#include <unordered_map>  // duplicate-host detection

namespace dslaunch::launcher {
namespace {

// A typo such as node[1-1000000] must not exhaust memory.
constexpr long kMaxHostsPerRange = 65536;
// ...and neither must many ranges together (a 1 KB file of ranges made 6M).
constexpr size_t kMaxHosts = 65536;
constexpr size_t kMaxHostNameLength = 253;
constexpr char kWhitespace[] = " \t\r\f\v";
constexpr char kExpectedKeys[] = "(expected slots=, max_slots=, port=, user=)";

std::string Quote(std::string_view s) { return "'" + std::string(s) + "'"; }

std::string Lower(std::string_view s) {
  std::string out(s);
  for (char& c : out)
    c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

bool IsDigits(std::string_view s) {
  return !s.empty() && std::all_of(s.begin(), s.end(),
                                   [](char c) { return c >= '0' && c <= '9'; });
}

// A decimal number without sign; nullopt if it is not one or overflows.
std::optional<long> ParseNumber(std::string_view s) {
  long value = 0;
  if (!IsDigits(s)) return std::nullopt;
  auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), value);
  if (ec != std::errc() || end != s.data() + s.size()) return std::nullopt;
  return value;
}

std::optional<int> ParsePositiveInt(std::string_view s) {
  std::optional<long> value = ParseNumber(s);
  if (!value || *value < 1 || *value > 0x7fffffff) return std::nullopt;
  return static_cast<int>(*value);
}

// Splits on spaces and tabs (and a CR left over from CRLF).
std::vector<std::string_view> Tokenize(std::string_view line) {
  std::vector<std::string_view> tokens;
  size_t pos = line.find_first_not_of(kWhitespace);
  while (pos != std::string_view::npos) {
    size_t end = line.find_first_of(kWhitespace, pos);
    if (end == std::string_view::npos) end = line.size();
    tokens.push_back(line.substr(pos, end - pos));
    pos = line.find_first_not_of(kWhitespace, end);
  }
  return tokens;
}

bool IsValidIpv4(std::string_view s) {
  int parts = 0;
  while (true) {
    size_t dot = s.find('.');
    std::string_view part = s.substr(0, dot);
    std::optional<long> value = ParseNumber(part);
    if (!value || part.size() > 3 || *value > 255) return false;
    ++parts;
    if (dot == std::string_view::npos) break;
    s.remove_prefix(dot + 1);
  }
  return parts == 4;
}

Status ValidateHostName(std::string_view name) {
  auto allowed = [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || c == '.' ||
           c == '-' || c == '_';
  };
  if (name.empty() || !std::all_of(name.begin(), name.end(), allowed)) {
    return DataError("invalid host name " + Quote(name) +
                     " (allowed: letters, digits, '.', '-', '_')");
  }
  if (name.front() == '-' || name.front() == '.') {
    return DataError("invalid host name " + Quote(name) +
                     " (must not start with '-' or '.')");
  }
  if (name.size() > kMaxHostNameLength) {
    return DataError("invalid host name " + Quote(name) +
                     " (longer than 253 characters)");
  }
  bool numeric =
      name.find_first_not_of("0123456789.") == std::string_view::npos;
  if (numeric && !IsValidIpv4(name)) {
    return DataError("invalid IPv4 address " + Quote(name));
  }
  return Status::Ok();
}

// Appends the numbers of one range item ("7" or "01-04") to `out`, keeping
// the zero-padding width of the lower bound.
Status ExpandRangeItem(std::string_view item, std::string_view range,
                       std::vector<std::string>& out, const std::string& prefix,
                       const std::string& suffix) {
  size_t dash = item.find('-');
  std::string_view lo_text = item.substr(0, dash);
  std::string_view hi_text =
      dash == std::string_view::npos ? lo_text : item.substr(dash + 1);
  std::optional<long> lo = ParseNumber(lo_text);
  std::optional<long> hi = ParseNumber(hi_text);
  std::string bad = "malformed range " + Quote(range) + ": ";
  if (!lo || !hi || lo_text.size() > 9 || hi_text.size() > 9) {
    return DataError(bad + Quote(item) + " is not a number or number range");
  }
  if (*lo > *hi) {
    return DataError(bad + "lower bound " + std::string(lo_text) +
                     " is greater than upper bound " + std::string(hi_text));
  }
  if (*hi - *lo + static_cast<long>(out.size()) >= kMaxHostsPerRange) {
    return DataError(bad + "expands to more than " +
                     std::to_string(kMaxHostsPerRange) + " hosts");
  }
  for (long n = *lo; n <= *hi; ++n) {
    std::string digits = std::to_string(n);
    if (digits.size() < lo_text.size())
      digits.insert(0, lo_text.size() - digits.size(), '0');
    out.push_back(prefix + digits + suffix);
  }
  return Status::Ok();
}

// Expands `prefix[items]suffix` into host names; a name without brackets is
// returned as is.
StatusOr<std::vector<std::string>> ExpandHostRange(std::string_view host) {
  size_t open = host.find('[');
  size_t close = host.find(']');
  if (open == std::string_view::npos && close == std::string_view::npos) {
    return std::vector<std::string>{std::string(host)};
  }
  std::string bad = "malformed range " + Quote(host) + ": ";
  if (open == std::string_view::npos || close < open)
    return DataError(bad + "']' without '['");
  if (close == std::string_view::npos) return DataError(bad + "missing ']'");
  std::string_view suffix = host.substr(close + 1);
  if (suffix.find_first_of("[]") != std::string_view::npos ||
      host.substr(open + 1, close - open - 1).find('[') !=
          std::string_view::npos) {
    return DataError(bad + "only one [...] group is allowed");
  }
  std::string_view items = host.substr(open + 1, close - open - 1);
  if (items.empty()) return DataError(bad + "empty range");
  std::vector<std::string> names;
  while (true) {
    size_t comma = items.find(',');
    std::string_view item = items.substr(0, comma);
    RETURN_IF_ERROR(ExpandRangeItem(item, host, names,
                                    std::string(host.substr(0, open)),
                                    std::string(suffix)));
    if (comma == std::string_view::npos) break;
    items.remove_prefix(comma + 1);
  }
  return names;
}

// Applies one `key=value` token to `entry`.
Status ApplyKey(std::string_view token, std::set<std::string>& seen,
                HostEntry& entry) {
  size_t eq = token.find('=');
  std::string key(token.substr(0, eq));
  bool known =
      key == "slots" || key == "max_slots" || key == "port" || key == "user";
  if (eq == std::string_view::npos || !known) {
    return DataError("unknown token " + Quote(token) + " " + kExpectedKeys);
  }
  if (!seen.insert(key).second) return DataError(Quote(key) + " given twice");
  std::string_view value = token.substr(eq + 1);
  if (key == "user") {
    if (value.empty()) return DataError("empty user");
    if (value.front() == '-') return DataError("invalid user " + Quote(value));
    entry.user = std::string(value);
    return Status::Ok();
  }
  std::optional<int> number = ParsePositiveInt(value);
  if (!number) {
    return DataError(key + " must be a positive integer, got " + Quote(value));
  }
  if (key == "port" && *number > 65535) {
    return DataError("port must be in 1..65535, got " + Quote(value));
  }
  if (key == "slots") entry.slots = *number;
  if (key == "max_slots") entry.max_slots = *number;
  if (key == "port") entry.port = *number;
  return Status::Ok();
}

// Parses the tokens of one non-blank line into `attrs` and the expanded host
// names. Errors carry no file:line prefix; the caller adds it.
Status ParseTokens(const std::vector<std::string_view>& tokens,
                   HostEntry& attrs, std::vector<std::string>& names) {
  if (tokens[0].find('=') != std::string_view::npos) {
    return DataError("expected a host name before " + Quote(tokens[0]));
  }
  std::set<std::string> seen;
  for (size_t i = 1; i < tokens.size(); ++i) {
    RETURN_IF_ERROR(ApplyKey(tokens[i], seen, attrs));
  }
  if (attrs.max_slots && *attrs.max_slots < attrs.slots) {
    return DataError("max_slots=" + std::to_string(*attrs.max_slots) +
                     " is less than slots=" + std::to_string(attrs.slots));
  }
  ASSIGN_OR_RETURN(names, ExpandHostRange(tokens[0]));
  for (const std::string& name : names) RETURN_IF_ERROR(ValidateHostName(name));
  return Status::Ok();
}

// Adds the hosts of one line, rejecting a host already seen (host names are
// compared case-insensitively, as DNS does).
Status AddHosts(const std::vector<std::string>& names, const HostEntry& attrs,
                std::unordered_map<std::string, int>& first_line,
                Hostfile& hostfile) {
  if (hostfile.hosts.size() + names.size() > kMaxHosts) {
    return DataError("more than " + std::to_string(kMaxHosts) +
                     " hosts in the hostfile");
  }
  for (const std::string& name : names) {
    auto [it, inserted] = first_line.emplace(Lower(name), attrs.line);
    if (!inserted) {
      return DataError("duplicate host " + Quote(name) + " (first on line " +
                       std::to_string(it->second) + ")");
    }
    HostEntry entry = attrs;
    entry.host = name;
    hostfile.hosts.push_back(std::move(entry));
  }
  return Status::Ok();
}

}  // namespace

StatusOr<Hostfile> ParseHostfile(std::string_view text,
                                 const std::string& path) {
  Hostfile hostfile;
  hostfile.path = path;
  std::unordered_map<std::string, int> first_line;
  int line_number = 0;
  while (!text.empty()) {
    size_t newline = text.find('\n');
    std::string_view line = text.substr(0, newline);
    text.remove_prefix(newline == std::string_view::npos ? text.size()
                                                         : newline + 1);
    ++line_number;
    std::vector<std::string_view> tokens =
        Tokenize(line.substr(0, line.find('#')));
    if (tokens.empty()) continue;
    HostEntry attrs;
    attrs.line = line_number;
    std::vector<std::string> names;
    Status status = ParseTokens(tokens, attrs, names);
    if (status.ok()) status = AddHosts(names, attrs, first_line, hostfile);
    if (!status.ok())
      return status.Annotate(path + ":" + std::to_string(line_number));
  }
  if (hostfile.hosts.empty()) return DataError(path + ": no hosts in hostfile");
  return hostfile;
}

StatusOr<Hostfile> LoadHostfile(const std::string& path) {
  auto read_error = [&path](int err) {
    return DataError("cannot read hostfile '" + path +
                     "': " + std::strerror(err));
  };
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return read_error(errno);
  std::string text;
  char buffer[65536];
  while (true) {
    ssize_t n = ::read(fd, buffer, sizeof(buffer));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      int err = errno;
      ::close(fd);
      return read_error(err);
    }
    if (n == 0) break;
    text.append(buffer, static_cast<size_t>(n));
  }
  ::close(fd);
  return ParseHostfile(text, path);
}

}  // namespace dslaunch::launcher
