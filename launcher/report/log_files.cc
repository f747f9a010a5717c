#include "launcher/report/log_files.h"

#include <errno.h>
#include <unistd.h>  // write, pread, close

namespace dslaunch::launcher {

namespace {

constexpr size_t kFileBuffer = 64u << 10;
constexpr size_t kCopyChunk = 1u << 20;

}  // namespace

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

StatusOr<base::SafeDir> OpenLogDir(const std::string& dir,
                                   const std::string& what) {
  return base::SafeDir::Open(dir, what);
}

// ---- SinkFile ----

StatusOr<std::unique_ptr<SinkFile>> SinkFile::Create(const base::SafeDir& dir,
                                                     const std::string& name,
                                                     ErrorCallback on_error) {
  ASSIGN_OR_RETURN(
      int fd, dir.OpenLog(name, base::PrivateFileMode(base::CurrentUmask())));
  return std::unique_ptr<SinkFile>(
      new SinkFile(dir.path() + "/" + name, fd, std::move(on_error)));
}

StatusOr<std::unique_ptr<SinkFile>> SinkFile::Create(const std::string& path,
                                                     ErrorCallback on_error) {
  ASSIGN_OR_RETURN(auto dir, base::SafeDir::OpenParent(path, "--log_dir",
                                                       /*create=*/false));
  ASSIGN_OR_RETURN(auto file,
                   Create(dir.first, dir.second, std::move(on_error)));
  file->path_ = path;  // as the caller named it
  return file;
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

RankLog::RankLog(std::unique_ptr<SinkFile> file,
                 std::shared_ptr<const base::SafeDir> spill_dir,
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
    held.spill_fd = spill_dir_->OpenUnnamed();
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
