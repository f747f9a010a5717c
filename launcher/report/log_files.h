// The launcher's files under --log_dir. SinkFile is an append-only file that
// keeps its first write error (path and errno text) instead of failing the
// job; RankLog is one rank's log, which assembles the pieces of long lines
// per stream so that every line reaches the file whole, stdout and stderr
// never torn into each other. Owned by Console; main thread only.
#pragma once

#include <sys/types.h>  // mode_t

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>

#include "proto/status.h"

namespace dslaunch::launcher {

// Mode of the files dslaunch creates under --log_dir: 0600, or 0640 when the
// umask already denies others everything (027, 007: a site sharing logs with
// a group); then the umask applies. Never wider than 0640.
mode_t LogFileMode(mode_t umask);
// The process's umask (read without changing it for good).
mode_t CurrentUmask();
// Writes all of `data` to `fd` (retrying short writes and EINTR); 0 or errno.
int WriteFd(int fd, std::string_view data);
// The same for directories it creates: 0700 or 0750.
mode_t LogDirMode(mode_t umask);
// mkdir -p with LogDirMode; existing directories are left as they are.
Status CreateLogDir(const std::string& dir);

class SinkFile {
 public:
  // Called once, with the first error ("cannot write PATH: strerror").
  using ErrorCallback = std::function<void(const Status&)>;

  // Creates (or truncates) `path` with LogFileMode.
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
  RankLog(std::unique_ptr<SinkFile> file, std::string spill_dir,
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
  std::string spill_dir_;
  size_t memory_per_stream_;
  Held held_[2];                  // stdout, stderr
  bool needs_separator_ = false;  // the file ends in a line with no newline
};

}  // namespace dslaunch::launcher
