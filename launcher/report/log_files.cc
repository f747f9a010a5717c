#include "launcher/report/log_files.h"

#include <errno.h>
#include <fcntl.h>     // open, O_TMPFILE
#include <sys/stat.h>  // mkdir, fchmod, umask
#include <unistd.h>    // write, pread, close, unlink

#include <filesystem>  // splitting --log_dir into its components

namespace dslaunch::launcher {

namespace {

constexpr size_t kFileBuffer = 64u << 10;
constexpr size_t kCopyChunk = 1u << 20;

bool SharesWithGroup(mode_t umask) { return (umask & 007) == 007; }

// An unlinked file in `dir` for a long line's pieces; -1 and errno if none.
int OpenSpill(const std::string& dir) {
  int fd = ::open(dir.c_str(), O_TMPFILE | O_RDWR | O_CLOEXEC, 0600);
  if (fd >= 0 || (errno != EOPNOTSUPP && errno != EISDIR)) return fd;
  std::string path = dir + "/.dslaunch-line-XXXXXX";
  fd = ::mkostemp(path.data(), O_CLOEXEC);
  if (fd >= 0) ::unlink(path.c_str());
  return fd;
}

}  // namespace

mode_t CurrentUmask() {
  const mode_t mask = ::umask(0);
  ::umask(mask);
  return mask;
}

int WriteFd(int fd, std::string_view data) {
  while (!data.empty()) {
    const ssize_t n = ::write(fd, data.data(), data.size());
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return errno;
    if (n == 0) return EIO;
    data.remove_prefix(static_cast<size_t>(n));
  }
  return 0;
}

mode_t LogFileMode(mode_t umask) {
  return (SharesWithGroup(umask) ? 0640 : 0600) & ~umask;
}

mode_t LogDirMode(mode_t umask) {
  return (SharesWithGroup(umask) ? 0750 : 0700) & ~umask;
}

Status CreateLogDir(const std::string& dir) {
  const mode_t mode = LogDirMode(CurrentUmask());
  std::filesystem::path path;
  for (const auto& part : std::filesystem::path(dir)) {
    path /= part;
    if (::mkdir(path.c_str(), mode) != 0 && errno != EEXIST) {
      return ErrnoStatus(
          "--log_dir " + dir + ": cannot create " + path.string(), errno);
    }
  }
  struct stat st;
  if (::stat(dir.c_str(), &st) != 0) {
    return ErrnoStatus("--log_dir " + dir, errno);
  }
  if (!S_ISDIR(st.st_mode)) {
    return InvalidArgument("--log_dir " + dir + ": not a directory");
  }
  return Status::Ok();
}

// ---- SinkFile ----

StatusOr<std::unique_ptr<SinkFile>> SinkFile::Create(const std::string& path,
                                                     ErrorCallback on_error) {
  const mode_t mode = LogFileMode(CurrentUmask());
  int fd = ::open(path.c_str(),
                  O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC, mode);
  if (fd < 0 && errno == ELOOP) {
    // A symbolic link is followed only to a device or to a pipe of ours (a
    // log sent to /dev/null or a FIFO on purpose), opened without creating
    // or truncating anything and without blocking: a FIFO nobody reads, or
    // one read slowly, is an error on this file, never a hung launcher. One
    // planted in a shared --log_dir that points at somebody's file is
    // refused, never truncated; a pipe of another user's never gets our logs.
    fd = ::open(path.c_str(), O_WRONLY | O_NONBLOCK | O_NOCTTY | O_CLOEXEC);
    if (fd < 0 && errno == ENXIO) {
      return IoError("cannot write " + path +
                     ": a symbolic link to a pipe that nobody reads");
    }
    if (fd < 0) return ErrnoStatus("cannot write " + path, errno);
    struct stat st;
    const bool ok = ::fstat(fd, &st) == 0 &&
                    (S_ISCHR(st.st_mode) ||
                     (S_ISFIFO(st.st_mode) && st.st_uid == ::geteuid()));
    if (!ok) {
      ::close(fd);
      return IoError("cannot write " + path +
                     ": a symbolic link is followed only to a device or to a "
                     "pipe of this user's");
    }
  }
  if (fd < 0) return ErrnoStatus("cannot write " + path, errno);
  // A file left by an earlier run keeps its mode through O_TRUNC. Only
  // regular files: --log_dir may hold links to devices or pipes.
  struct stat st;
  if (::fstat(fd, &st) == 0 && S_ISREG(st.st_mode)) (void)::fchmod(fd, mode);
  return std::unique_ptr<SinkFile>(new SinkFile(path, fd, std::move(on_error)));
}

SinkFile::SinkFile(std::string path, int fd, ErrorCallback on_error)
    : path_(std::move(path)), fd_(fd), on_error_(std::move(on_error)) {}

SinkFile::~SinkFile() { Close(); }

void SinkFile::Append(std::string_view data) {
  if (!status_.ok() || fd_ < 0) return;
  if (buffer_.size() + data.size() > kFileBuffer) Flush();
  if (data.size() >= kFileBuffer) return WriteOut(data);
  buffer_.append(data);
}

void SinkFile::Flush() {
  if (buffer_.empty()) return;
  WriteOut(buffer_);
  buffer_.clear();
}

void SinkFile::WriteOut(std::string_view data) {
  if (!status_.ok() || fd_ < 0) return;
  if (int err = WriteFd(fd_, data)) Fail("", err);
}

void SinkFile::Close() {
  if (fd_ < 0) return;
  Flush();
  if (::close(fd_) != 0) Fail("close", errno);
  fd_ = -1;
}

void SinkFile::Fail(const std::string& what, int err) {
  if (!status_.ok()) return;
  status_ = ErrnoStatus(
      "cannot write " + path_ + (what.empty() ? "" : " (" + what + ")"), err);
  buffer_.clear();
  if (on_error_) on_error_(status_);
}

// ---- RankLog ----

RankLog::RankLog(std::unique_ptr<SinkFile> file, std::string spill_dir,
                 size_t memory_per_stream)
    : file_(std::move(file)),
      spill_dir_(std::move(spill_dir)),
      memory_per_stream_(memory_per_stream) {}

RankLog::~RankLog() {
  EndOfOutput();
  file_->Close();
}

void RankLog::Piece(bool is_stderr, std::string_view piece, bool ends_line) {
  Held& held = held_[is_stderr ? 1 : 0];
  if (ends_line) return WriteLine(held, piece, /*terminated=*/true);
  Hold(held, piece);
}

void RankLog::EndOfOutput() {
  for (Held& held : held_) {
    if (!held.memory.empty() || held.spill_fd >= 0) {
      WriteLine(held, {}, /*terminated=*/false);
    }
  }
}

void RankLog::Hold(Held& held, std::string_view piece) {
  if (!file_->status().ok()) return;  // incomplete already: keep nothing
  if (held.spill_fd < 0 &&
      held.memory.size() + piece.size() <= memory_per_stream_) {
    held.memory.append(piece);
    return;
  }
  if (held.spill_fd < 0) {
    held.spill_fd = OpenSpill(spill_dir_);
    if (held.spill_fd < 0) return file_->Fail("spill file", errno);
    if (int err = WriteFd(held.spill_fd, held.memory)) {
      return file_->Fail("spill file", err);
    }
    std::string().swap(held.memory);  // give the memory back
  }
  if (int err = WriteFd(held.spill_fd, piece)) file_->Fail("spill file", err);
}

void RankLog::WriteLine(Held& held, std::string_view tail, bool terminated) {
  if (needs_separator_) {
    file_->Append("\n");
    needs_separator_ = false;
  }
  if (held.spill_fd >= 0) CopySpill(held);
  file_->Append(held.memory);
  held.memory.clear();
  if (held.memory.capacity() > kFileBuffer) std::string().swap(held.memory);
  file_->Append(tail);
  if (terminated) {
    file_->Append("\n");
  } else {
    needs_separator_ = true;
  }
}

void RankLog::CopySpill(Held& held) {
  std::string chunk(kCopyChunk, '\0');
  off_t offset = 0;
  while (true) {
    const ssize_t n =
        ::pread(held.spill_fd, chunk.data(), chunk.size(), offset);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) file_->Fail("spill file", errno);
    if (n <= 0) break;
    file_->Append(std::string_view(chunk.data(), static_cast<size_t>(n)));
    offset += n;
  }
  ::close(held.spill_fd);
  held.spill_fd = -1;
}

}  // namespace dslaunch::launcher
