// ReadErrorFile: what a failed rank left in its TORCHELASTIC_ERROR_FILE
// (torch.distributed.elastic's @record JSON), read defensively because the
// rank chose the contents and could have replaced the file: never through a
// symlink, regular files only (a FIFO does not block), bounded. Pure
// function of the filesystem; any thread.
#pragma once

#include <cstddef>
#include <string>

#include "base/status.h"

namespace dslaunch::agent {

inline constexpr size_t kMaxErrorFileBytes = 64 * 1024;

// The file's first `max_bytes` bytes (the rest dropped), "" when there is
// no file. An error when it is a symlink, not a regular file, or unreadable.
StatusOr<std::string> ReadErrorFile(const std::string& path,
                                    size_t max_bytes = kMaxErrorFileBytes);

}  // namespace dslaunch::agent
