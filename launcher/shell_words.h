// --launcher_args as words, the way a POSIX shell splits them.
#pragma once

#include <string>
#include <vector>

#include "base/status.h"

namespace dslaunch::launcher {

// Splits --launcher_args into words as a POSIX shell would, without any
// expansion: blanks separate, '...' is literal, "..." and a backslash escape
// as in sh. InvalidArgument for an unterminated quote or trailing backslash.
StatusOr<std::vector<std::string>> SplitShellWords(const std::string& text);

}  // namespace dslaunch::launcher
