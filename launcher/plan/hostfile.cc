#include "launcher/plan/hostfile.h"

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

constexpr size_t kMaxHostNameLength = 253;
constexpr char kWhitespace[] = " \t\r\f\v";
constexpr char kExpectedKeys[] = "(expected slots=, max_slots=, port=, user=)";

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

std::optional<int> ParseIntIn(std::string_view s, int lo, int hi) {
  std::optional<long> value = ParseNumber(s);
  if (!value || *value < lo || *value > hi) return std::nullopt;
  return static_cast<int>(*value);
}

// A byte that may not appear on a line: NUL and other control characters
// (tab, and the CR of CRLF, are whitespace). Returns its column (1-based).
std::optional<size_t> ControlCharacterColumn(std::string_view line) {
  for (size_t i = 0; i < line.size(); ++i) {
    unsigned char c = static_cast<unsigned char>(line[i]);
    bool space = c != 0 && std::strchr(kWhitespace, c) != nullptr;
    if ((c < 0x20 && !space) || c == 0x7f) return i + 1;
  }
  return std::nullopt;
}

Status CheckLine(std::string_view line) {
  if (line.size() > kMaxLineBytes) {
    return DataError("line is longer than " + std::to_string(kMaxLineBytes) +
                     " bytes");
  }
  if (std::optional<size_t> column = ControlCharacterColumn(line)) {
    return DataError("control character " +
                     Quoted(line.substr(*column - 1, 1)) + " in column " +
                     std::to_string(*column) + " (is this a text file?)");
  }
  return Status::Ok();
}

// user= : a login name, not an option and nothing a shell or ssh would
// interpret.
Status ValidateUser(std::string_view user) {
  if (user.empty()) return DataError("empty user");
  auto allowed = [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || c == '.' ||
           c == '-' || c == '_' || c == '@';
  };
  if (user.front() == '-' || user.size() > kMaxUserLength ||
      !std::all_of(user.begin(), user.end(), allowed)) {
    return DataError("invalid user " + Quoted(user) +
                     " (allowed: letters, digits, '.', '-', '_', '@'; not "
                     "starting with '-'; at most " +
                     std::to_string(kMaxUserLength) + " characters)");
  }
  return Status::Ok();
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
    return DataError("invalid host name " + Quoted(name) +
                     " (allowed: letters, digits, '.', '-', '_')");
  }
  if (name.front() == '-' || name.front() == '.') {
    return DataError("invalid host name " + Quoted(name) +
                     " (must not start with '-' or '.')");
  }
  if (name.size() > kMaxHostNameLength) {
    return DataError("invalid host name " + Quoted(name) +
                     " (longer than 253 characters)");
  }
  bool numeric =
      name.find_first_not_of("0123456789.") == std::string_view::npos;
  if (numeric && !IsValidIpv4(name)) {
    return DataError("invalid IPv4 address " + Quoted(name));
  }
  return Status::Ok();
}

// Appends the numbers of one range item ("7" or "01-04") to `out`, keeping
// the zero-padding width of the lower bound.
// At most `room` names may be added in all.
Status ExpandRangeItem(std::string_view item, std::string_view range,
                       size_t room, std::vector<std::string>& out,
                       const std::string& prefix, const std::string& suffix) {
  size_t dash = item.find('-');
  std::string_view lo_text = item.substr(0, dash);
  std::string_view hi_text =
      dash == std::string_view::npos ? lo_text : item.substr(dash + 1);
  std::optional<long> lo = ParseNumber(lo_text);
  std::optional<long> hi = ParseNumber(hi_text);
  std::string bad = "malformed range " + Quoted(range) + ": ";
  if (!lo || !hi) {
    return DataError(bad + Quoted(item) + " is not a number or number range");
  }
  if (lo_text.size() > kMaxRangeDigits || hi_text.size() > kMaxRangeDigits) {
    return DataError(bad + Quoted(item) + " has more than " +
                     std::to_string(kMaxRangeDigits) + " digits");
  }
  if (*lo > *hi) {
    return DataError(bad + "lower bound " + std::string(lo_text) +
                     " is greater than upper bound " + std::string(hi_text));
  }
  if (static_cast<size_t>(*hi - *lo) + out.size() >= room) {
    return DataError(bad + "expands to more than " + std::to_string(room) +
                     (room == static_cast<size_t>(kMaxHosts)
                          ? " hosts (the limit per hostfile)"
                          : " hosts, the room left under the limit of " +
                                std::to_string(kMaxHosts) +
                                " hosts per hostfile"));
  }
  for (long n = *lo; n <= *hi; ++n) {
    std::string digits = std::to_string(n);
    if (digits.size() < lo_text.size())
      digits.insert(0, lo_text.size() - digits.size(), '0');
    out.push_back(prefix + digits + suffix);
  }
  return Status::Ok();
}

// The numbers of one bracket group's items ("01-04,07"), zero-padded as
// written; at most `room` of them.
StatusOr<std::vector<std::string>> ExpandGroup(std::string_view items,
                                               std::string_view host,
                                               size_t room) {
  if (items.empty())
    return DataError("malformed range " + Quoted(host) + ": empty range");
  std::vector<std::string> numbers;
  while (true) {
    size_t comma = items.find(',');
    RETURN_IF_ERROR(
        ExpandRangeItem(items.substr(0, comma), host, room, numbers, "", ""));
    if (comma == std::string_view::npos) break;
    items.remove_prefix(comma + 1);
  }
  return numbers;
}

}  // namespace

StatusOr<std::vector<std::string>> ExpandHostRange(std::string_view host,
                                                   size_t room) {
  if (host.find_first_of("[]") == std::string_view::npos)
    return std::vector<std::string>{std::string(host)};  // checked as a name
  const std::string_view whole = host;
  const std::string bad = "malformed range " + Quoted(host) + ": ";
  std::vector<std::string> names = {""};
  // The longest name so far: past the limit on a host name, it is an error
  // before anything is multiplied (long names times many groups would
  // otherwise make megabytes of names that are all invalid).
  size_t longest = 0;
  auto too_long = [&] {
    return DataError("invalid host name " + Quoted(whole) +
                     " (its names are longer than " +
                     std::to_string(kMaxHostNameLength) + " characters)");
  };
  while (!host.empty()) {
    const size_t open = host.find_first_of("[]");
    const std::string_view text = host.substr(0, open);
    longest += text.size();
    if (longest > kMaxHostNameLength) return too_long();
    for (auto& name : names) name.append(text);
    if (open == std::string_view::npos) break;
    if (host[open] == ']') return DataError(bad + "']' without '['");
    const size_t close = host.find_first_of("[]", open + 1);
    if (close == std::string_view::npos) return DataError(bad + "missing ']'");
    if (host[close] == '[') return DataError(bad + "'[' inside [...]");
    ASSIGN_OR_RETURN(
        std::vector<std::string> numbers,
        ExpandGroup(host.substr(open + 1, close - open - 1), whole, room));
    size_t digits = 0;
    for (const auto& number : numbers) digits = std::max(digits, number.size());
    longest += digits;
    if (longest > kMaxHostNameLength) return too_long();
    // Every name so far times every number: the first group varies slowest.
    if (numbers.size() * names.size() > room) {
      return DataError(bad + "expands to more than " + std::to_string(room) +
                       " hosts");
    }
    std::vector<std::string> product;
    product.reserve(names.size() * numbers.size());
    for (const auto& name : names) {
      for (const auto& number : numbers) product.push_back(name + number);
    }
    names = std::move(product);
    host.remove_prefix(close + 1);
  }
  return names;
}

StatusOr<std::vector<std::string>> ExpandHostlist(std::string_view list,
                                                  size_t room) {
  std::vector<std::string> hosts;
  size_t start = 0;
  int depth = 0;
  for (size_t i = 0; i <= list.size(); ++i) {
    if (i < list.size() && list[i] == '[') ++depth;
    if (i < list.size() && list[i] == ']') --depth;
    if (i < list.size() && (list[i] != ',' || depth > 0)) continue;
    const std::string_view item = list.substr(start, i - start);
    if (item.empty()) {
      return DataError("empty host name in host list " + Quoted(list));
    }
    ASSIGN_OR_RETURN(std::vector<std::string> names,
                     ExpandHostRange(item, room - hosts.size()));
    for (auto& name : names) {
      RETURN_IF_ERROR(ValidateHostName(name));
      hosts.push_back(std::move(name));
    }
    start = i + 1;
  }
  return hosts;
}

namespace {

// Applies one `key=value` token to `entry`.
Status ApplyKey(std::string_view token, std::set<std::string>& seen,
                HostEntry& entry) {
  size_t eq = token.find('=');
  std::string key(token.substr(0, eq));
  bool known =
      key == "slots" || key == "max_slots" || key == "port" || key == "user";
  if (eq == std::string_view::npos || !known) {
    return DataError("unknown token " + Quoted(token) + " " + kExpectedKeys);
  }
  if (!seen.insert(key).second) return DataError(Quoted(key) + " given twice");
  std::string_view value = token.substr(eq + 1);
  if (key == "user") {
    RETURN_IF_ERROR(ValidateUser(value));
    entry.user = std::string(value);
    return Status::Ok();
  }
  const int max = key == "port" ? 65535 : kMaxSlotsPerHost;
  std::optional<int> number = ParseIntIn(value, 1, max);
  if (!number) {
    return DataError(key + " must be an integer in 1.." + std::to_string(max) +
                     ", got " + Quoted(value));
  }
  if (key == "slots") entry.slots = *number;
  if (key == "max_slots") entry.max_slots = *number;
  if (key == "port") entry.port = *number;
  return Status::Ok();
}

// Parses the tokens of one non-blank line into `attrs` and the expanded host
// names. Errors carry no file:line prefix; the caller adds it.
Status ParseTokens(const std::vector<std::string_view>& tokens, size_t room,
                   HostEntry& attrs, std::vector<std::string>& names) {
  if (tokens[0].find('=') != std::string_view::npos) {
    return DataError("expected a host name before " + Quoted(tokens[0]));
  }
  std::set<std::string> seen;
  for (size_t i = 1; i < tokens.size(); ++i) {
    RETURN_IF_ERROR(ApplyKey(tokens[i], seen, attrs));
  }
  if (attrs.max_slots && *attrs.max_slots < attrs.slots) {
    return DataError("max_slots=" + std::to_string(*attrs.max_slots) +
                     " is less than slots=" + std::to_string(attrs.slots));
  }
  if (room == 0) {
    return DataError("more than " + std::to_string(kMaxHosts) +
                     " hosts (the limit per hostfile)");
  }
  ASSIGN_OR_RETURN(names, ExpandHostRange(tokens[0], room));
  for (const std::string& name : names) RETURN_IF_ERROR(ValidateHostName(name));
  return Status::Ok();
}

// Adds the hosts of one line, rejecting a host already seen (host names are
// compared case-insensitively, as DNS does) and slots past kMaxTotalSlots.
Status AddHosts(const std::vector<std::string>& names, const HostEntry& attrs,
                std::unordered_map<std::string, int>& first_line,
                long& total_slots, Hostfile& hostfile) {
  total_slots += static_cast<long>(names.size()) * attrs.slots;
  if (total_slots > kMaxTotalSlots) {
    return DataError("more than " + std::to_string(kMaxTotalSlots) +
                     " slots in the hostfile (the limit on ranks in a job)");
  }
  for (const std::string& name : names) {
    auto [it, inserted] = first_line.emplace(HostKey(name), attrs.line);
    if (!inserted) {
      return DataError("duplicate host " + Quoted(name) + " (first on line " +
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
  long total_slots = 0;
  int line_number = 0;
  while (!text.empty()) {
    size_t newline = text.find('\n');
    std::string_view line = text.substr(0, newline);
    text.remove_prefix(newline == std::string_view::npos ? text.size()
                                                         : newline + 1);
    ++line_number;
    Status status = CheckLine(line);
    std::vector<std::string_view> tokens =
        Tokenize(line.substr(0, line.find('#')));
    if (status.ok() && tokens.empty()) continue;
    HostEntry attrs;
    attrs.line = line_number;
    std::vector<std::string> names;
    const size_t room = kMaxHosts - hostfile.hosts.size();
    if (status.ok()) status = ParseTokens(tokens, room, attrs, names);
    if (status.ok())
      status = AddHosts(names, attrs, first_line, total_slots, hostfile);
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
    if (text.size() > kMaxHostfileBytes) {
      ::close(fd);
      return DataError(path + ": larger than " +
                       std::to_string(kMaxHostfileBytes >> 20) +
                       " MiB (the limit for a hostfile)");
    }
  }
  ::close(fd);
  return ParseHostfile(text, path);
}

std::string Quoted(std::string_view s) {
  constexpr size_t kMaxQuoted = 300;  // longer text is cut
  static const char kHex[] = "0123456789abcdef";
  std::string out = "'";
  for (size_t i = 0; i < s.size() && i < kMaxQuoted; ++i) {
    unsigned char c = static_cast<unsigned char>(s[i]);
    if (c >= 0x20 && c < 0x7f) {
      out.push_back(static_cast<char>(c));
    } else {
      out += {'\\', 'x', kHex[c >> 4], kHex[c & 15]};
    }
  }
  return out + (s.size() > kMaxQuoted ? "'..." : "'");
}

std::string HostKey(std::string_view host) {
  std::string out(host);
  for (char& c : out)
    c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

}  // namespace dslaunch::launcher
