// The environment a job carries to its ranks on top of what each node's
// agent has: variables exported from the launcher's environment by prefix
// (--export; NCCL_, PYTHON, UCX_, OMP_, CUDA, LD_LIBRARY_PATH, ... by
// default), .deepspeed_env from the home and current directories, each
// --env_file, and each --env K=V, later sources winning. Pure functions.
#pragma once

#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "proto/status.h"

namespace dslaunch::launcher {

using EnvList = std::vector<std::pair<std::string, std::string>>;

// Prefixes exported to remote ranks unless told otherwise.
const std::vector<std::string>& DefaultExportPrefixes();

// Parses an env file: KEY=VALUE per line, optional leading "export ",
// blank lines, '#' comments (whole line, or after whitespace outside quotes),
// values unquoted, 'single-quoted' (literal) or "double-quoted" (backslash
// escapes quote, backslash, dollar, n and t). Errors are DataError naming
// `path:line`.
StatusOr<EnvList> ParseEnvFile(std::string_view text, const std::string& path);
StatusOr<EnvList> LoadEnvFile(const std::string& path);

struct JobEnvSources {
  const char* const* environ = nullptr;      // the launcher's environment
  std::vector<std::string> export_prefixes;  // empty = the defaults
  std::vector<std::string> env_file_dirs;    // where .deepspeed_env may be
  std::vector<std::string> env_files;        // --env_file, in order
  std::vector<std::string> env;              // --env K=V, in order
};

// The job's env, deduplicated (last wins) and in first-seen order.
StatusOr<EnvList> CollectJobEnv(const JobEnvSources& sources);

}  // namespace dslaunch::launcher
