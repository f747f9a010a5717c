// The worker library's version string (shared with dslaunch and dsagent).
#include "proto/version.h"

namespace dslaunch::worker {

const char* Version() { return kVersion; }

}  // namespace dslaunch::worker
