// The launcher's files under --log_dir. SinkFile is an append-only file that
// keeps its first write error (path and errno text) instead of failing the
// job; RankLog is one rank's log, which assembles the pieces of long lines
// per stream so that every line reaches the file whole, stdout and stderr
// never torn into each other. Owned by Console; main thread only.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>

#include "base/safe_files.h"
#include "base/status.h"

namespace dslaunch::launcher {

// Writes all of `data` to `fd` (retrying short writes and EINTR); 0 or errno.
int WriteFd(int fd, std::string_view data);
// Opens (mkdir -p) the directory of the rank logs, `what` naming the flag:
// SafeDir's rule of base/safe_files.h (this user's; those above it this
// user's or root's; new ones 0700, or 0750 under a umask of 027 or 007).
StatusOr<base::SafeDir> OpenLogDir(const std::string& dir,
                                   const std::string& what = "--log_dir");

class SinkFile {
 public:
  // Called once, with the first error ("cannot write PATH: strerror").
  using ErrorCallback = std::function<void(const Status&)>;

  // Creates (or truncates) `name` in `dir` by SafeDir::OpenLog's rule
  // (mode PrivateFileMode: 0600, or 0640 under a umask of 027 or 007).
  static StatusOr<std::unique_ptr<SinkFile>> Create(const base::SafeDir& dir,
                                                    const std::string& name,
                                                    ErrorCallback on_error);
  // The same for `path` in an existing --log_dir, opened again by its rule.
  static StatusOr<std::unique_ptr<SinkFile>> Create(const std::string& path,
                                                    ErrorCallback on_error);
  ~SinkFile();  // Close()
  SinkFile(const SinkFile&) = delete;
  SinkFile& operator=(const SinkFile&) = delete;

  // Buffered. After the first error, data is discarded (the file is then
  // incomplete, and status() says why).
  void Append(std::string_view data);
  void Flush();
  void Close();
  // Records an error that makes this file incomplete (e.g. a spill failed).
  void Fail(const std::string& what, int err);
  const Status& status() const { return status_; }
  const std::string& path() const { return path_; }

 private:
  SinkFile(std::string path, int fd, ErrorCallback on_error);
  void WriteOut(std::string_view data);

  std::string path_;
  int fd_;
  ErrorCallback on_error_;
  std::string buffer_;
  Status status_;
};

class RankLog {
 public:
  static constexpr size_t kDefaultMemoryPerStream = 4u << 20;

  // Pieces of a line beyond `memory_per_stream` are spilled to an unlinked
  // file in `spill_dir`, so a line of any length costs bounded memory.
  RankLog(std::unique_ptr<SinkFile> file,
          std::shared_ptr<const base::SafeDir> spill_dir,
          size_t memory_per_stream = kDefaultMemoryPerStream);
  ~RankLog();
  RankLog(const RankLog&) = delete;
  RankLog& operator=(const RankLog&) = delete;

  // One piece of the rank's output; `ends_line`: a newline followed it.
  void Piece(bool is_stderr, std::string_view piece, bool ends_line);
  // The rank's output ended: held pieces become lines without a newline.
  void EndOfOutput();
  SinkFile& file() { return *file_; }

 private:
  struct Held {
    std::string memory;
    int spill_fd = -1;  // once the line outgrew memory
  };
  void Hold(Held& held, std::string_view piece);
  void WriteLine(Held& held, std::string_view tail, bool terminated);
  void CopySpill(Held& held);

  std::unique_ptr<SinkFile> file_;
  std::shared_ptr<const base::SafeDir> spill_dir_;
  size_t memory_per_stream_;
  Held held_[2];                  // stdout, stderr
  bool needs_separator_ = false;  // the file ends in a line with no newline
};

}  // namespace dslaunch::launcher
