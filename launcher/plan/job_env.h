// The environment a job carries to its ranks on top of what each node's
// agent has: the launcher's interpreter environment (PATH, VIRTUAL_ENV,
// CONDA_PREFIX, CONDA_DEFAULT_ENV, LD_LIBRARY_PATH: remote ranks run the
// same python in the same venv or conda env, as DeepSpeed's runners make
// them), variables exported from the launcher's environment by prefix
// (--export; NCCL_, PYTHON, UCX_, OMP_, CUDA, HF_, WANDB_, ... by default),
// .deepspeed_env from the home and current directories ($DS_ENV_FILE names
// another file, as for DeepSpeed), each --env_file, and each --env K=V,
// later sources winning. Pure functions.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "base/status.h"

namespace dslaunch::launcher {

using EnvList = std::vector<std::pair<std::string, std::string>>;

// Prefixes exported to remote ranks unless told otherwise.
const std::vector<std::string>& DefaultExportPrefixes();
// Variables that always go with the job (the interpreter environment);
// --env and env files can still set them.
const std::vector<std::string>& InterpreterVariables();

// The .deepspeed_env files to read, as DeepSpeed's runner finds them: the
// name $DS_ENV_FILE (default ".deepspeed_env") in the home directory, then
// in the current one (an absolute $DS_ENV_FILE: that file, once). Files that
// do not exist are skipped when read; the others are read as LoadEnvFile.
std::vector<std::string> DeepSpeedEnvFiles(const std::string& home,
                                           const std::string& ds_env_file);

// Parses an env file: KEY=VALUE per line, optional leading "export ",
// blank lines, '#' comments (whole line, or after whitespace outside quotes),
// values unquoted, 'single-quoted' (literal) or "double-quoted" (backslash
// escapes quote, backslash, dollar, n and t). Errors are DataError naming
// `path:line`.
StatusOr<EnvList> ParseEnvFile(std::string_view text, const std::string& path);

// An env file sets LD_PRELOAD and the like for every rank: it is read only
// if it is a regular file (never a FIFO or device, opened without blocking)
// of this user's or root's, not writable by everyone, and at most this long.
// base::ReadTrustedFile's rule; its errors are DataErrors naming the file.
inline constexpr size_t kMaxEnvFileBytes = 1u << 20;
StatusOr<EnvList> LoadEnvFile(const std::string& path);

struct JobEnvSources {
  const char* const* environ = nullptr;          // the launcher's environment
  std::vector<std::string> export_prefixes;      // empty = the defaults
  std::vector<std::string> deepspeed_env_files;  // read when they exist
  std::vector<std::string> env_files;            // --env_file, in order
  std::vector<std::string> env;                  // --env K=V, in order
};

// The job's env, deduplicated (last wins) and in first-seen order.
StatusOr<EnvList> CollectJobEnv(const JobEnvSources& sources);

}  // namespace dslaunch::launcher
