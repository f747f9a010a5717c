// The one rule for every file and directory dslaunch writes for its user
// (--log_dir and its failure/ bundle, --enable_each_rank_log, --tensorboard
// runs, dsworker's event files) and for the small files it trusts (env
// files): never another user's, and opened without a gap between checking
// and using. A SafeDir holds an open directory; whatever is made in it is
// opened relative to that descriptor, never by path again. Move-only value;
// any thread (one at a time per object).
#pragma once

#include <sys/types.h>  // mode_t, uid_t

#include <cstddef>
#include <string>
#include <utility>

#include "base/status.h"

namespace dslaunch::base {

// The process's umask (read without changing it for good).
mode_t CurrentUmask();
// Files dslaunch creates: 0600, or 0640 when the umask already denies others
// everything (027, 007: a site sharing logs with a group); then the umask
// applies. Never wider than 0640.
mode_t PrivateFileMode(mode_t umask);
// The same for directories: 0700 or 0750.
mode_t PrivateDirMode(mode_t umask);

class SafeDir {
 public:
  // Opens the directory `path`, walked one component at a time from / (a
  // relative path: from the working directory), each opened relative to the
  // one before with O_NOFOLLOW; with `create`, missing ones are made with
  // PrivateDirMode. The rule:
  //  - the directory itself belongs to this user (the effective uid);
  //  - every directory above it (the working directory first, for a relative
  //    path) belongs to this user or to root: another user could rename
  //    entries of theirs at will (root's /tmp, being sticky, lets nobody
  //    rename ours);
  //  - a symbolic link on the way is followed only when it belongs to this
  //    user or root, and what it names is walked by the same rule.
  // Errors are IoErrors (sysexits 74) that begin "`what` `path`: " and name
  // the directory at fault.
  static StatusOr<SafeDir> Open(const std::string& path,
                                const std::string& what, bool create = true);

  // The directory above the last component of `path` (a file or a run
  // directory named by a path), opened by Open's rule, and that component.
  // Errors begin "`what` `path`: ".
  static StatusOr<std::pair<SafeDir, std::string>> OpenParent(
      const std::string& path, const std::string& what, bool create = true);

  SafeDir(SafeDir&& other) noexcept;
  SafeDir& operator=(SafeDir&& other) noexcept;
  SafeDir(const SafeDir&) = delete;
  SafeDir& operator=(const SafeDir&) = delete;
  ~SafeDir();

  // The directory `name` (one component this process chose: "failure",
  // "rank-3") in this one, made if missing. Never a symbolic link; must
  // belong to this user.
  StatusOr<SafeDir> Child(const std::string& name, bool create = true) const;

  // A new file `name` (O_CREAT|O_EXCL|O_NOFOLLOW): its descriptor, to be
  // closed by the caller. When it exists, *exists is set (if given) and the
  // error says so.
  StatusOr<int> CreateNew(const std::string& name, mode_t mode,
                          bool* exists = nullptr) const;

  // A log file `name`, opened for writing without ever blocking (a FIFO
  // nobody reads is an error, not a hang):
  //  - missing: created with `mode`;
  //  - a regular file: only this user's with a single name (no hard link to
  //    something else), then truncated and set to `mode`;
  //  - a FIFO of this user's or a character device (a log sent to /dev/null
  //    or a pipe on purpose), directly or through a symbolic link, which is
  //    followed to nothing else; kept non-blocking.
  // Errors begin "cannot write <path>/<name>: ".
  StatusOr<int> OpenLog(const std::string& name, mode_t mode) const;

  // An unnamed file in this directory (O_TMPFILE, else a named one unlinked
  // at once): its descriptor, or -1 with errno set.
  int OpenUnnamed() const;

  // A descriptor to read the directory's entries (fdopendir); -1 and errno.
  int OpenForReading() const;

  // O_PATH descriptor of the directory, for *at() calls; owned here.
  int fd() const { return fd_; }
  // The path as given (plus the names of children), for messages.
  const std::string& path() const { return path_; }

 private:
  SafeDir(int fd, std::string path, std::string what)
      : fd_(fd), path_(std::move(path)), what_(std::move(what)) {}
  // Open's walk; errors begin with `prefix`.
  static StatusOr<SafeDir> Walked(const std::string& path,
                                  const std::string& what,
                                  const std::string& prefix, bool create);
  StatusOr<int> OpenLinkedLog(const std::string& name) const;

  int fd_ = -1;
  std::string path_;
  std::string what_;  // the setting, for messages ("--log_dir")
};

// Reads a small file that decides what runs (an env file): only a regular
// file, reached without blocking (a FIFO, a device, /dev/zero are refused),
// belonging to this user or root and not writable by others, at most
// `max_bytes` long. A symbolic link is followed (dotfile managers, mounted
// ConfigMaps) when this user or root made it, and what it reaches must
// pass. Group-writable only when the group is its owner's own (a user
// private group); root's file only under one name (no hard link another
// user made). Errors are DataErrors (65) that begin "`what` `path`: "; a
// missing file is NotFound.
StatusOr<std::string> ReadTrustedFile(const std::string& path,
                                      const std::string& what,
                                      size_t max_bytes);

}  // namespace dslaunch::base
