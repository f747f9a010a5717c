#include "base/safe_files.h"

#include <fcntl.h>     // openat, O_*
#include <grp.h>       // getgrgid_r
#include <limits.h>    // PATH_MAX
#include <pwd.h>       // getpwuid_r
#include <sys/stat.h>  // fstat, mkdirat, umask
#include <unistd.h>    // close, readlinkat, unlinkat, geteuid

#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstring>  // strerror
#include <deque>

namespace dslaunch::base {
namespace {

constexpr int kMaxLinks = 40;  // as the kernel's own walk (ELOOP)

// Closes on scope exit unless released.
class Fd {
 public:
  explicit Fd(int fd = -1) : fd_(fd) {}
  ~Fd() { Reset(-1); }
  Fd(Fd&& other) noexcept : fd_(other.Release()) {}
  Fd& operator=(Fd&& other) noexcept {
    Reset(other.Release());
    return *this;
  }
  void Reset(int fd) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = fd;
  }
  int get() const { return fd_; }
  int Release() {
    const int fd = fd_;
    fd_ = -1;
    return fd;
  }

 private:
  int fd_;
};

bool OursOrRoot(uid_t uid) { return uid == ::geteuid() || uid == 0; }

std::string Joined(const std::string& dir, const std::string& name) {
  if (dir.empty() || dir == ".") return name;
  return dir.back() == '/' ? dir + name : dir + "/" + name;
}

// The components of a path, "" and "." left out.
std::deque<std::string> Components(const std::string& path) {
  std::deque<std::string> out;
  size_t start = 0;
  while (start <= path.size()) {
    size_t end = path.find('/', start);
    if (end == std::string::npos) end = path.size();
    std::string part = path.substr(start, end - start);
    if (!part.empty() && part != ".") out.push_back(std::move(part));
    start = end + 1;
  }
  return out;
}

// One step of a walk: the directory `name` in `dir` (made if missing and
// `create`), or, when `name` is a symbolic link, the link itself (O_PATH).
struct Step {
  Fd fd;
  bool is_link = false;
  Status status;
};

Step StepInto(int dir, const std::string& name, bool create,
              const std::string& shown) {
  Step step;
  for (int tries = 0; tries < 2; ++tries) {
    step.fd.Reset(::openat(dir, name.c_str(),
                           O_PATH | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
    if (step.fd.get() >= 0) return step;
    if (errno != ENOENT || !create) break;
    if (::mkdirat(dir, name.c_str(), PrivateDirMode(CurrentUmask())) != 0 &&
        errno != EEXIST) {
      step.status = IoErrno("cannot create " + shown, errno);
      return step;
    }
  }
  const int err = errno;
  if (err != ENOTDIR && err != ELOOP) {
    step.status = IoErrno("cannot open " + shown, err);
    return step;
  }
  // Not a directory: a symbolic link (held, not followed), or an error.
  step.fd.Reset(::openat(dir, name.c_str(), O_PATH | O_NOFOLLOW | O_CLOEXEC));
  struct stat st {};
  if (step.fd.get() >= 0 && ::fstat(step.fd.get(), &st) == 0 &&
      S_ISLNK(st.st_mode)) {
    step.is_link = true;
    return step;
  }
  step.status = IoError(shown + ": not a directory");
  return step;
}

// `fd` is a directory of this user's (`last`), or of this user's or root's.
Status CheckOwner(int fd, const std::string& shown, bool last) {
  struct stat st {};
  if (::fstat(fd, &st) != 0) return IoErrno("cannot open " + shown, errno);
  if (!S_ISDIR(st.st_mode)) return IoError(shown + ": not a directory");
  // The directory written into: another user able to write there could
  // plant names in it (sticky: only next to ours, never instead of them).
  if (last && st.st_uid == ::geteuid() && (st.st_mode & S_IWOTH) &&
      !(st.st_mode & S_ISVTX)) {
    return IoError(shown +
                   " is writable by every user (chmod o-w, or +t); "
                   "nothing is written there");
  }
  if (st.st_uid == ::geteuid() || (!last && st.st_uid == 0))
    return Status::Ok();
  return IoError(shown + " belongs to another user (uid " +
                 std::to_string(st.st_uid) + "); nothing is written there");
}

// The target of the link held by `link`, if it may be followed.
StatusOr<std::string> FollowableTarget(int link, const std::string& shown) {
  struct stat st {};
  if (::fstat(link, &st) != 0) return IoErrno("cannot open " + shown, errno);
  if (!OursOrRoot(st.st_uid)) {
    return IoError(shown + ": a symbolic link of another user (uid " +
                   std::to_string(st.st_uid) + "), not followed");
  }
  char target[PATH_MAX];
  const ssize_t n = ::readlinkat(link, "", target, sizeof target);
  if (n < 0) return IoErrno("cannot read the link " + shown, errno);
  if (n == 0 || static_cast<size_t>(n) >= sizeof target)
    return IoError(shown + ": a symbolic link with no usable target");
  return std::string(target, static_cast<size_t>(n));
}

// A walk's state: the directory reached, how it is shown, what is left.
struct Walk {
  Fd dir;
  std::string shown;
  std::deque<std::string> left;
  int links = 0;
};

Status Restart(Walk& w, bool absolute) {
  w.shown = absolute ? "/" : ".";
  w.dir.Reset(::open(w.shown.c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC));
  if (w.dir.get() < 0) return IoErrno("cannot open " + w.shown, errno);
  return CheckOwner(w.dir.get(), w.shown, w.left.empty());
}

// Follows the link held by `link` (named `shown`): its target's components
// go first in what is left.
Status Follow(Walk& w, int link, const std::string& shown) {
  if (++w.links > kMaxLinks) return IoErrno(shown, ELOOP);
  ASSIGN_OR_RETURN(std::string target, FollowableTarget(link, shown));
  std::deque<std::string> parts = Components(target);
  w.left.insert(w.left.begin(), parts.begin(), parts.end());
  if (target[0] == '/') return Restart(w, true);
  if (w.left.empty()) return CheckOwner(w.dir.get(), w.shown, true);
  return Status::Ok();
}

Status WalkOne(Walk& w, bool create) {
  const std::string name = w.left.front();
  w.left.pop_front();
  const std::string shown = Joined(w.shown, name);
  Step step = StepInto(w.dir.get(), name, create, shown);
  RETURN_IF_ERROR(step.status);
  if (step.is_link) return Follow(w, step.fd.get(), shown);
  RETURN_IF_ERROR(CheckOwner(step.fd.get(), shown, w.left.empty()));
  w.dir.Reset(step.fd.Release());
  w.shown = shown;
  return Status::Ok();
}

}  // namespace

mode_t CurrentUmask() {
  const mode_t mask = ::umask(0);
  ::umask(mask);
  return mask;
}

mode_t PrivateFileMode(mode_t umask) {
  return ((umask & 007) == 007 ? 0640 : 0600) & ~umask;
}

mode_t PrivateDirMode(mode_t umask) {
  return ((umask & 007) == 007 ? 0750 : 0700) & ~umask;
}

StatusOr<SafeDir> SafeDir::Open(const std::string& path,
                                const std::string& what, bool create) {
  return Walked(path, what, what + " " + path, create);
}

StatusOr<std::pair<SafeDir, std::string>> SafeDir::OpenParent(
    const std::string& path, const std::string& what, bool create) {
  std::string trimmed = path;
  while (trimmed.size() > 1 && trimmed.back() == '/') trimmed.pop_back();
  const size_t slash = trimmed.rfind('/');
  const std::string parent = slash == std::string::npos ? "."
                             : slash == 0               ? "/"
                                          : trimmed.substr(0, slash);
  std::string name = trimmed.substr(slash == std::string::npos ? 0 : slash + 1);
  if (name.empty() || name == "." || name == "..")
    return IoError(what + " " + path + ": names no file or directory");
  ASSIGN_OR_RETURN(SafeDir dir,
                   Walked(parent, what, what + " " + path, create));
  return std::make_pair(std::move(dir), std::move(name));
}

StatusOr<SafeDir> SafeDir::Walked(const std::string& path,
                                  const std::string& what,
                                  const std::string& prefix, bool create) {
  if (path.empty()) return IoError(what + ": an empty directory name");
  Walk w;
  w.left = Components(path);
  Status st = Restart(w, path[0] == '/');
  while (st.ok() && !w.left.empty()) st = WalkOne(w, create);
  if (!st.ok()) return st.Annotate(prefix);
  return SafeDir(w.dir.Release(), path, what);
}

SafeDir::SafeDir(SafeDir&& other) noexcept
    : fd_(other.fd_),
      path_(std::move(other.path_)),
      what_(std::move(other.what_)) {
  other.fd_ = -1;
}

SafeDir& SafeDir::operator=(SafeDir&& other) noexcept {
  if (this != &other) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = other.fd_;
    other.fd_ = -1;
    path_ = std::move(other.path_);
    what_ = std::move(other.what_);
  }
  return *this;
}

SafeDir::~SafeDir() {
  if (fd_ >= 0) ::close(fd_);
}

StatusOr<SafeDir> SafeDir::Child(const std::string& name, bool create) const {
  const std::string shown = Joined(path_, name);
  if (name.empty() || name == "." || name == ".." ||
      name.find('/') != std::string::npos) {
    return IoError(what_ + " " + shown + ": not a name in " + path_);
  }
  Step step = StepInto(fd_, name, create, shown);
  if (step.status.ok() && step.is_link) {
    step.status = IoError(shown + ": a symbolic link, not followed");
  }
  if (step.status.ok()) step.status = CheckOwner(step.fd.get(), shown, true);
  if (!step.status.ok()) return step.status.Annotate(what_);
  return SafeDir(step.fd.Release(), shown, what_);
}

StatusOr<int> SafeDir::CreateNew(const std::string& name, mode_t mode,
                                 bool* exists) const {
  const int fd =
      ::openat(fd_, name.c_str(),
               O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, mode);
  if (fd >= 0) return fd;
  const int err = errno;
  if (exists != nullptr) *exists = err == EEXIST;
  return IoErrno("cannot create " + Joined(path_, name), err);
}

StatusOr<int> SafeDir::OpenLog(const std::string& name, mode_t mode) const {
  const std::string shown = "cannot write " + Joined(path_, name);
  Fd fd(::openat(
      fd_, name.c_str(),
      O_WRONLY | O_CREAT | O_NOFOLLOW | O_NONBLOCK | O_NOCTTY | O_CLOEXEC,
      mode));
  if (fd.get() < 0 && errno == ELOOP) return OpenLinkedLog(name);
  if (fd.get() < 0 && errno == ENXIO)
    return IoError(shown + ": a pipe that nobody reads");
  if (fd.get() < 0) return IoErrno(shown, errno);
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0) return IoErrno(shown, errno);
  if (S_ISCHR(st.st_mode) || (S_ISFIFO(st.st_mode) && st.st_uid == ::geteuid()))
    return fd.Release();
  if (!S_ISREG(st.st_mode))
    return IoError(shown +
                   ": neither a regular file, a device nor a pipe "
                   "of this user's");
  if (st.st_uid != ::geteuid())
    return IoError(shown + ": the file belongs to another user (uid " +
                   std::to_string(st.st_uid) + ")");
  if (st.st_nlink > 1)
    return IoError(shown + ": the file has other names (hard links)");
  // Checked first, truncated after: never another user's file emptied. A
  // file left by an earlier run gets `mode` again.
  if (::ftruncate(fd.get(), 0) != 0) return IoErrno(shown, errno);
  (void)::fchmod(fd.get(), mode);
  const int flags = ::fcntl(fd.get(), F_GETFL);
  if (flags >= 0) (void)::fcntl(fd.get(), F_SETFL, flags & ~O_NONBLOCK);
  return fd.Release();
}

// A symbolic link is followed only to a device or to a pipe of ours (a log
// sent to /dev/null or a FIFO on purpose), opened without creating or
// truncating anything and without blocking: a FIFO nobody reads, or one read
// slowly, is an error on this file, never a hung process. One planted that
// points at somebody's file is refused, never truncated; a pipe of another
// user's never gets our logs.
StatusOr<int> SafeDir::OpenLinkedLog(const std::string& name) const {
  const std::string shown = "cannot write " + Joined(path_, name);
  // Only a link of ours (or root's): a link another user planted in a
  // directory they may write would send our logs wherever they chose.
  struct stat link {};
  if (::fstatat(fd_, name.c_str(), &link, AT_SYMLINK_NOFOLLOW) != 0)
    return IoErrno(shown, errno);
  if (!OursOrRoot(link.st_uid)) {
    return IoError(shown + ": a symbolic link of another user (uid " +
                   std::to_string(link.st_uid) + "), not followed");
  }
  Fd fd(::openat(fd_, name.c_str(),
                 O_WRONLY | O_NONBLOCK | O_NOCTTY | O_CLOEXEC));
  if (fd.get() < 0 && errno == ENXIO)
    return IoError(shown + ": a symbolic link to a pipe that nobody reads");
  if (fd.get() < 0) return IoErrno(shown, errno);
  struct stat st {};
  const bool ok = ::fstat(fd.get(), &st) == 0 &&
                  (S_ISCHR(st.st_mode) ||
                   (S_ISFIFO(st.st_mode) && st.st_uid == ::geteuid()));
  if (!ok)
    return IoError(shown +
                   ": a symbolic link is followed only to a device or to a "
                   "pipe of this user's");
  return fd.Release();
}

int SafeDir::OpenUnnamed() const {
  int fd = ::openat(fd_, ".", O_TMPFILE | O_RDWR | O_CLOEXEC, 0600);
  if (fd >= 0 || (errno != EOPNOTSUPP && errno != EISDIR)) return fd;
  // No O_TMPFILE here: a new name (O_EXCL: nothing planted is opened),
  // unlinked at once.
  static std::atomic<uint64_t> counter{0};
  for (int attempt = 0; attempt < 100; ++attempt) {
    const std::string name = ".dslaunch-line-" + std::to_string(::getpid()) +
                             "-" + std::to_string(counter++);
    fd = ::openat(fd_, name.c_str(),
                  O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (fd >= 0) {
      ::unlinkat(fd_, name.c_str(), 0);
      return fd;
    }
    if (errno != EEXIST) return -1;
  }
  return -1;
}

int SafeDir::OpenForReading() const {
  return ::openat(fd_, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
}

// True when group `gid` is `uid`'s own (its primary group, with no other
// member listed): a file writable by it is writable by that user alone.
bool UsersOwnGroup(gid_t gid, uid_t uid) {
  char buf[16384];
  struct passwd pw {};
  struct passwd* pwp = nullptr;
  if (::getpwuid_r(uid, &pw, buf, sizeof buf, &pwp) != 0 || pwp == nullptr ||
      pw.pw_gid != gid)
    return false;
  char gbuf[65536];
  struct group gr {};
  struct group* grp = nullptr;
  if (::getgrgid_r(gid, &gr, gbuf, sizeof gbuf, &grp) != 0 || grp == nullptr)
    return false;
  for (char** m = gr.gr_mem; *m != nullptr; ++m) {
    if (std::strcmp(*m, pw.pw_name) != 0) return false;
  }
  return true;
}

StatusOr<std::string> ReadTrustedFile(const std::string& path,
                                      const std::string& what,
                                      size_t max_bytes) {
  const std::string shown = what + " " + path;
  // A link is followed only when this user or root made it: one another
  // user planted (a shared working directory) would make us read, and
  // quote, whatever it names.
  struct stat link {};
  if (::lstat(path.c_str(), &link) == 0 && S_ISLNK(link.st_mode) &&
      !OursOrRoot(link.st_uid)) {
    return DataError(shown + ": a symbolic link of another user (uid " +
                     std::to_string(link.st_uid) + "); not followed");
  }
  // Non-blocking: a FIFO nobody writes is opened at once, then refused.
  Fd fd(::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_NOCTTY | O_CLOEXEC));
  if (fd.get() < 0 && errno == ENOENT)
    return NotFound(shown + ": " + std::strerror(ENOENT));
  if (fd.get() < 0) return DataError(shown + ": " + std::strerror(errno));
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0)
    return DataError(shown + ": " + std::strerror(errno));
  if (!S_ISREG(st.st_mode))
    return DataError(shown +
                     ": not a regular file (a pipe, a device or a "
                     "directory is never read)");
  if (!OursOrRoot(st.st_uid))
    return DataError(shown + ": belongs to another user (uid " +
                     std::to_string(st.st_uid) + "); not read");
  if (st.st_mode & S_IWOTH)
    return DataError(shown + ": writable by every user; not read");
  if ((st.st_mode & S_IWGRP) && !UsersOwnGroup(st.st_gid, st.st_uid)) {
    return DataError(shown + ": writable by group " +
                     std::to_string(st.st_gid) +
                     ", which is not its owner's own; not read (chmod g-w)");
  }
  // Root's file under a second name: a hard link someone else made to it.
  if (st.st_uid != ::geteuid() && st.st_nlink > 1)
    return DataError(shown +
                     ": root's file with more than one name (a hard "
                     "link another user may have made); not read");
  const std::string too_big =
      shown + ": larger than " + std::to_string(max_bytes) + " bytes";
  if (static_cast<uint64_t>(st.st_size) > max_bytes) return DataError(too_big);
  std::string text;
  char chunk[64 * 1024];
  while (text.size() <= max_bytes) {
    const ssize_t n = ::read(fd.get(), chunk, sizeof chunk);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return DataError(shown + ": " + std::strerror(errno));
    if (n == 0) break;
    text.append(chunk, static_cast<size_t>(n));
  }
  if (text.size() > max_bytes) return DataError(too_big);  // it grew
  return text;
}

}  // namespace dslaunch::base
