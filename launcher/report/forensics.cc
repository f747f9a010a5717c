#include "launcher/report/forensics.h"

#include <dirent.h>
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
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

Status WriteFile(const std::string& path, const std::string& text) {
  Status first;
  {
    auto file = SinkFile::Create(path, [&](const Status& st) {
      if (first.ok()) first = st;
    });
    if (!file.ok()) return file.status();
    (*file)->Append(text);
    (*file)->Close();
  }
  return first;
}

bool OurFile(const std::string& name) {
  return name == "report.txt" || name == "plan.txt" || name == "env.txt" ||
         name == "last-lines.txt" || name.rfind("stacks-rank-", 0) == 0 ||
         name.rfind("error-file-rank-", 0) == 0;
}

// Removes the files an earlier bundle left, and only those; a `failure`
// that is a symbolic link is refused, never followed.
Status EmptyBundleDir(const std::string& dir) {
  const int fd =
      ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) return ErrnoStatus("cannot open " + dir, errno);
  DIR* d = ::fdopendir(fd);
  if (d == nullptr) {
    ::close(fd);
    return ErrnoStatus("cannot read " + dir, errno);
  }
  while (const dirent* e = ::readdir(d)) {
    if (OurFile(e->d_name)) ::unlinkat(dirfd(d), e->d_name, 0);
  }
  ::closedir(d);
  return Status::Ok();
}

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

// "scheme://user:password@host" with the password replaced.
static std::string ScrubUrlPasswords(std::string value) {
  size_t from = 0;
  while ((from = value.find("://", from)) != std::string::npos) {
    const size_t start = from + 3;
    const size_t at = value.find('@', start);
    const size_t end = value.find_first_of("/ ", start);
    const size_t colon = value.find(':', start);
    if (at != std::string::npos && colon < at &&
        (end == std::string::npos || at < end))
      value.replace(colon + 1, at - colon - 1, "<redacted>");
    from = start;
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
  const std::string dir = log_dir + "/failure";
  RETURN_IF_ERROR(CreateLogDir(dir));
  RETURN_IF_ERROR(EmptyBundleDir(dir));
  std::string report;
  for (const auto& line : r.report) report += line + "\n";
  RETURN_IF_ERROR(WriteFile(dir + "/report.txt", report));
  RETURN_IF_ERROR(WriteFile(dir + "/plan.txt", r.plan));
  RETURN_IF_ERROR(
      WriteFile(dir + "/env.txt",
                "# what every rank got on top of its agent's environment\n" +
                    RedactedEnv(r.rank_env, r.job_secret) +
                    "\n# the launcher's environment\n" +
                    RedactedEnv(r.launcher_env, r.job_secret)));
  std::string last;
  for (const auto& [rank, lines] : r.last_lines) {
    last += "== rank " + std::to_string(rank) + " ==\n";
    for (const auto& line : lines)
      last += proto::EscapeControlChars(line) + "\n";
  }
  RETURN_IF_ERROR(WriteFile(dir + "/last-lines.txt", last));
  for (const auto& [rank, text] : r.stacks) {
    RETURN_IF_ERROR(
        WriteFile(dir + "/stacks-rank-" + std::to_string(rank) + ".txt", text));
  }
  for (const auto& [rank, json] : r.error_files) {
    RETURN_IF_ERROR(WriteFile(
        dir + "/error-file-rank-" + std::to_string(rank) + ".json", json));
  }
  return dir;
}

}  // namespace dslaunch::launcher
