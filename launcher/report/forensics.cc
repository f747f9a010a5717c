#include "launcher/report/forensics.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <memory>
#include <nlohmann/json.hpp>

#include "launcher/report/log_files.h"
#include "proto/progress.h"  // EscapeControlChars

namespace dslaunch::launcher {

namespace {

constexpr size_t kMaxLine = 400;

std::string Bounded(std::string_view text) {
  std::string out = proto::EscapeControlChars(text.substr(0, kMaxLine));
  if (text.size() > kMaxLine) out += "...";
  return out;
}

std::vector<std::string> SplitLines(const std::string& text) {
  std::vector<std::string> lines;
  size_t start = 0;
  while (start < text.size()) {
    size_t end = text.find('\n', start);
    if (end == std::string::npos) end = text.size();
    lines.push_back(text.substr(start, end - start));
    start = end + 1;
  }
  return lines;
}

bool OurFile(const std::string& name) {
  return name == "report.txt" || name == "plan.txt" || name == "env.txt" ||
         name == "last-lines.txt" || name.rfind("stacks-rank-", 0) == 0 ||
         name.rfind("error-file-rank-", 0) == 0;
}

// <log_dir>/failure, opened once by SafeDir's rule: every file is made new
// in the directory that was opened (a `failure` swapped for a link
// meanwhile, or a link planted inside it, is never written through), after
// the files an earlier bundle left, and only those, were removed.
class BundleDir {
 public:
  Status Open(const std::string& log_dir) {
    ASSIGN_OR_RETURN(base::SafeDir logs, OpenLogDir(log_dir));
    ASSIGN_OR_RETURN(base::SafeDir failure, logs.Child("failure"));
    dir_ = std::make_unique<base::SafeDir>(std::move(failure));
    const int fd = dir_->OpenForReading();  // closedir closes it
    DIR* d = fd < 0 ? nullptr : ::fdopendir(fd);
    if (d == nullptr) {
      if (fd >= 0) ::close(fd);
      return ErrnoStatus("cannot read " + dir_->path(), errno);
    }
    while (const dirent* e = ::readdir(d)) {
      if (OurFile(e->d_name)) ::unlinkat(dir_->fd(), e->d_name, 0);
    }
    ::closedir(d);
    return Status::Ok();
  }
  const std::string& path() const { return dir_->path(); }
  // Writes the file `name`: the pieces `pieces` hands to the function it
  // is called with, in order.
  template <typename Pieces>
  Status WritePieces(const std::string& name, const Pieces& pieces) {
    const std::string path = dir_->path() + "/" + name;
    ASSIGN_OR_RETURN(
        const int fd,
        dir_->CreateNew(name, base::PrivateFileMode(base::CurrentUmask())));
    int err = 0;
    pieces([&](std::string_view piece) {
      if (err == 0) err = WriteFd(fd, piece);
    });
    if (::close(fd) != 0 && err == 0) err = errno;
    return err ? ErrnoStatus("cannot write " + path, err) : Status::Ok();
  }
  Status Write(const std::string& name, std::string_view text) {
    return WritePieces(name, [&](const auto& put) { put(text); });
  }

 private:
  std::unique_ptr<base::SafeDir> dir_;
};

}  // namespace

std::vector<std::string> DescribeErrorFile(std::string_view json,
                                           size_t frames) {
  const auto doc = nlohmann::json::parse(json, nullptr, false);
  if (!doc.is_object() || !doc.contains("message")) return {};
  const auto& message = doc["message"];
  std::string text, stack;
  if (message.is_string()) {
    text = message.get<std::string>();
  } else if (message.is_object()) {
    if (message.contains("message") && message["message"].is_string())
      text = message["message"].get<std::string>();
    const auto extra = message.value("extraInfo", nlohmann::json::object());
    if (extra.is_object() && extra.contains("py_callstack") &&
        extra["py_callstack"].is_string())
      stack = extra["py_callstack"].get<std::string>();
  }
  if (text.empty() && stack.empty()) return {};
  std::vector<std::string> out;
  if (!text.empty()) out.push_back("exception: " + Bounded(text));
  std::vector<std::string> lines = SplitLines(stack);
  while (!lines.empty() &&
         lines.back().find_first_not_of(" \t") == std::string::npos)
    lines.pop_back();
  const size_t first = lines.size() > frames ? lines.size() - frames : 0;
  if (first > 0)
    out.push_back("traceback (last " + std::to_string(frames) + " of " +
                  std::to_string(lines.size()) + " lines):");
  for (size_t i = first; i < lines.size(); ++i)
    out.push_back("  " + Bounded(lines[i]));
  return out;
}

bool IsSecretName(std::string_view name) {
  std::string upper(name);
  std::transform(upper.begin(), upper.end(), upper.begin(),
                 [](unsigned char c) { return std::toupper(c); });
  for (const char* word : {"SECRET", "TOKEN", "PASSWORD", "PASSWD", "PASS_",
                           "CREDENTIAL", "PRIVATE", "AUTH", "COOKIE"}) {
    if (upper.find(word) != std::string::npos) return true;
  }
  auto ends = [&](std::string_view tail) {
    return upper.size() >= tail.size() &&
           upper.compare(upper.size() - tail.size(), tail.size(), tail) == 0;
  };
  // KEY, PASS and PWD at the end (DB_PASS, MYSQL_PWD; not PWD, OLDPWD).
  return ends("KEY") || ends("PASS") ||
         (ends("_PWD") && upper != "PWD" && upper != "OLDPWD");
}

// URLs' credentials replaced: "scheme://user:password@host" keeps the user,
// "scheme://token@host" (pip's index URLs, git+https) loses the token. The
// authority ends at the first '/', '?', '#' or a separator of lists; its
// credentials end at its last '@' (a password may hold one).
static std::string ScrubUrlPasswords(std::string value) {
  size_t from = 0;
  while ((from = value.find("://", from)) != std::string::npos) {
    const size_t start = from + 3;
    size_t end = value.find_first_of("/?# \t,;\"'", start);
    if (end == std::string::npos) end = value.size();
    const size_t at = value.rfind('@', end - 1);
    if (end > start && at != std::string::npos && at >= start) {
      const size_t colon = value.find(':', start);
      const size_t keep = colon < at ? colon + 1 : start;
      value.replace(keep, at - keep, "<redacted>");
      from = keep + 10;  // past "<redacted>"
    } else {
      from = start;
    }
  }
  return value;
}

std::string RedactedEnv(const EnvList& env, const std::string& job_secret) {
  std::string out;
  for (const auto& [key, value] : env) {
    const bool hide =
        IsSecretName(key) ||
        (!job_secret.empty() && value.find(job_secret) != std::string::npos);
    out += proto::EscapeControlChars(key) + "=" +
           (hide ? "<redacted>"
                 : proto::EscapeControlChars(ScrubUrlPasswords(value))) +
           "\n";
  }
  return out;
}

StatusOr<std::string> WriteFailureBundle(const std::string& log_dir,
                                         const FailureRecord& r) {
  BundleDir bundle;
  RETURN_IF_ERROR(bundle.Open(log_dir));
  std::string report;
  for (const auto& line : r.report) report += line + "\n";
  RETURN_IF_ERROR(bundle.Write("report.txt", report));
  RETURN_IF_ERROR(bundle.Write("plan.txt", r.plan));
  RETURN_IF_ERROR(bundle.Write(
      "env.txt", "# what every rank got on top of its agent's environment\n" +
                     RedactedEnv(r.rank_env, r.job_secret) +
                     "\n# the launcher's environment\n" +
                     RedactedEnv(r.launcher_env, r.job_secret)));
  // Rank by rank: thousands of ranks' lines are never one string.
  RETURN_IF_ERROR(bundle.WritePieces("last-lines.txt", [&](const auto& put) {
    for (const auto& [rank, lines] : r.last_lines) {
      std::string text = "== rank " + std::to_string(rank) + " ==\n";
      if (lines != nullptr) {
        for (const auto& line : *lines)
          text += proto::EscapeControlChars(line) + "\n";
      }
      put(text);
    }
  }));
  for (const auto& [rank, text] : r.stacks) {
    RETURN_IF_ERROR(
        bundle.Write("stacks-rank-" + std::to_string(rank) + ".txt", text));
  }
  for (const auto& [rank, json] : r.error_files) {
    RETURN_IF_ERROR(bundle.Write(
        "error-file-rank-" + std::to_string(rank) + ".json", json));
  }
  return bundle.path();
}

}  // namespace dslaunch::launcher
