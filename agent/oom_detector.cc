#include "agent/oom_detector.h"

#include <fcntl.h>  // open, O_NONBLOCK
#include <spdlog/spdlog.h>
#include <unistd.h>  // read, lseek, close

#include <array>
#include <cerrno>
#include <charconv>
#include <cstring>

#include "base/process_tree.h"  // Cgroup2Mount, Cgroup2Path

namespace dslaunch::agent {

namespace {

constexpr size_t kMaxOomLines = 64;        // kept between Explain calls
constexpr size_t kMaxOomLineBytes = 1024;  // each

// A small text file (procfs, cgroupfs), at most `max` bytes; "" if none.
std::string ReadSmall(const std::string& path, size_t max = 4096) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return "";
  std::string data(max, '\0');
  const ssize_t n = ::read(fd, data.data(), max);
  ::close(fd);
  data.resize(n > 0 ? static_cast<size_t>(n) : 0);
  return data;
}

std::string_view MessageOf(std::string_view record) {
  const size_t semi = record.find(';');
  if (semi == std::string_view::npos) return {};
  std::string_view msg = record.substr(semi + 1);
  return msg.substr(0, msg.find('\n'));  // continuation lines: key=value
}

}  // namespace

std::string OomKillMessage(std::string_view record, pid_t pid) {
  const std::string_view msg = MessageOf(record);
  const std::string id = std::to_string(pid);
  if (msg.find("Killed process " + id + " (") != std::string_view::npos ||
      (msg.find("oom-kill:") != std::string_view::npos &&
       msg.find(",pid=" + id + ",") != std::string_view::npos)) {
    return std::string(msg);
  }
  return "";
}

bool IsOomKillRecord(std::string_view record) {
  const std::string_view msg = MessageOf(record);
  return msg.find("Killed process ") != std::string_view::npos ||
         msg.find("oom-kill:") != std::string_view::npos;
}

int64_t OomKillCount(std::string_view events) {
  size_t at = 0;
  while (at < events.size()) {
    size_t end = events.find('\n', at);
    if (end == std::string_view::npos) end = events.size();
    const std::string_view line = events.substr(at, end - at);
    constexpr std::string_view kKey = "oom_kill ";
    if (line.substr(0, kKey.size()) == kKey) {
      int64_t n = -1;
      const std::string_view v = line.substr(kKey.size());
      if (std::from_chars(v.data(), v.data() + v.size(), n).ec == std::errc())
        return n;
      return -1;
    }
    at = end + 1;
  }
  return -1;
}

std::string MemoryEventsDir(std::string dir, const std::string& mount) {
  while (!mount.empty() && dir.size() > mount.size() + 1 &&
         dir.compare(0, mount.size(), mount) == 0 && dir[mount.size()] == '/') {
    if (::access((dir + "/memory.events").c_str(), R_OK) == 0) return dir;
    dir.resize(dir.rfind('/'));
  }
  return "";  // the root cgroup has no memory.events
}

std::string DescribeMemoryMax(std::string_view text) {
  while (!text.empty() && (text.back() == '\n' || text.back() == ' '))
    text.remove_suffix(1);
  uint64_t n = 0;
  const auto [end, ec] =
      std::from_chars(text.data(), text.data() + text.size(), n);
  if (ec != std::errc() || end != text.data() + text.size())
    return std::string(text);
  constexpr uint64_t kKiB = 1024, kMiB = kKiB * 1024, kGiB = kMiB * 1024;
  if (n >= kGiB && n % kGiB == 0) return std::to_string(n / kGiB) + " GiB";
  if (n >= kMiB && n % kMiB == 0) return std::to_string(n / kMiB) + " MiB";
  if (n >= kKiB && n % kKiB == 0) return std::to_string(n / kKiB) + " KiB";
  return std::to_string(n) + " bytes";
}

OomDetector::OomDetector(OomOptions options) : options_(std::move(options)) {}

OomDetector::~OomDetector() {
  if (kmsg_fd_ >= 0) ::close(kmsg_fd_);
}

void OomDetector::Start(const std::string& cgroup_dir) {
  started_ = true;
  kmsg_fd_ =
      ::open(options_.kmsg_path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  // Only what the kernel logs from now on: an old OOM kill of a process
  // whose pid a rank got later is not this rank's.
  if (kmsg_fd_ >= 0) ::lseek(kmsg_fd_, 0, SEEK_END);
  if (kmsg_fd_ < 0)
    spdlog::debug("{}: {}; OOM kills are told by memory.events",
                  options_.kmsg_path, std::strerror(errno));
  std::string mount = options_.cgroup_mount;
  if (mount.empty())
    mount = base::Cgroup2Mount(ReadSmall("/proc/self/mountinfo", 1 << 20));
  std::string dir = cgroup_dir;
  if (dir.empty() && !mount.empty()) {
    const std::string own = base::Cgroup2Path(ReadSmall("/proc/self/cgroup"));
    if (!own.empty()) dir = mount + (own == "/" ? "" : own);
  }
  events_dir_ = MemoryEventsDir(dir, mount);
  job_cgroup_ = cgroup_dir;
}

void OomDetector::NoteSpawned(int rank, const std::string& cgroup_dir) {
  if (!started_) Start(cgroup_dir);
  if (events_dir_.empty()) return;
  baseline_[rank] = OomKillCount(ReadSmall(events_dir_ + "/memory.events"));
}

std::optional<std::string> OomDetector::Explain(int rank, pid_t pid) {
  if (!started_) return std::nullopt;
  ReadKernelLog();
  if (auto line = FromKernelLog(pid)) return line;
  return FromCgroup(rank);
}

// Reads the records logged since the last call (one record per read) and
// keeps the OOM killer's; bounded in records read and lines kept.
void OomDetector::ReadKernelLog() {
  if (kmsg_fd_ < 0) return;
  std::array<char, 16 * 1024> buf;  // a record is at most 8 KiB
  for (size_t i = 0; i < options_.max_records; ++i) {
    const ssize_t n = ::read(kmsg_fd_, buf.data(), buf.size());
    if (n < 0 && (errno == EINTR || errno == EPIPE))
      continue;         // EPIPE: overwritten
    if (n <= 0) break;  // EAGAIN: no more
    const std::string_view record(buf.data(), static_cast<size_t>(n));
    if (!IsOomKillRecord(record)) continue;
    oom_lines_.emplace_back(record.substr(0, kMaxOomLineBytes));
    if (oom_lines_.size() > kMaxOomLines) oom_lines_.pop_front();
  }
}

std::optional<std::string> OomDetector::FromKernelLog(pid_t pid) const {
  std::string found;
  // "Killed process" (with its sizes) over the "oom-kill:" summary.
  for (const std::string& record : oom_lines_) {
    std::string msg = OomKillMessage(record, pid);
    if (msg.empty()) continue;
    if (found.empty() || msg.find("Killed process") != std::string::npos)
      found = std::move(msg);
  }
  if (found.empty()) return std::nullopt;
  return "kernel log: " + found;
}

std::optional<std::string> OomDetector::FromCgroup(int rank) const {
  const auto it = baseline_.find(rank);
  if (events_dir_.empty() || it == baseline_.end() || it->second < 0)
    return std::nullopt;
  const int64_t now = OomKillCount(ReadSmall(events_dir_ + "/memory.events"));
  if (now <= it->second) return std::nullopt;
  // The counter counts every process of that cgroup and those below it;
  // unless it is the job's own cgroup, another process may have been the
  // one killed, and the kernel log (which names the pid) was not readable.
  const bool own = events_dir_ == job_cgroup_;
  return std::string(own ? "" : "probably: ") + "oom-kill in " + events_dir_ +
         " (memory.max " +
         DescribeMemoryMax(ReadSmall(events_dir_ + "/memory.max")) + ")" +
         (own ? ""
              : ", the job's cgroup or one above it; the kernel log "
                "(which names the process) was not readable");
}

}  // namespace dslaunch::agent
