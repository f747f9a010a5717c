// llm.c's model_*.bin files: import and export of a flat parameter buffer
// laid out by a ParamLayout (either order; the file is always in llm.c's
// order). Free functions; any thread, one call per file at a time.
// Model-level wrappers (ReadModelFile, WriteModelFile of a Model) are in
// worker/model.h.
#pragma once

#include <span>    // parameter buffers
#include <string>  // file paths

#include "base/status.h"          // Status, StatusOr
#include "worker/param_layout.h"  // ModelConfig, ParamLayout

namespace dslaunch::worker {

// llm.c's model file: int32 header[256] = {20240326, 3 (fp32), maxT, V, L,
// NH, C, Vp, 0...}, then every tensor in llm.c's order as fp32.
inline constexpr int kModelFileMagic = 20240326;
inline constexpr int kModelFileVersionFp32 = 3;

// Writes `params` (laid out by `layout`) to path, through path + ".tmp" and
// a rename. REQUIRES: params.size() == layout.num_params().
Status WriteModelFile(const std::string& path, const ParamLayout& layout,
                      std::span<const float> params);
// The header's config. DataError naming the file on a short header, wrong
// magic or version, or an invalid config.
StatusOr<ModelConfig> ReadModelFileConfig(const std::string& path);
// Header and parameters into `params` (laid out by `layout`, whose config
// must match the file's). DataError naming the file if truncated or longer
// than expected. REQUIRES: params.size() == layout.num_params().
Status ReadModelFileParams(const std::string& path, const ParamLayout& layout,
                           std::span<float> params);

}  // namespace dslaunch::worker
