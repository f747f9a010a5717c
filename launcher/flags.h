// The dslaunch command line, parsed with CLI11 into LaunchOptions
// (options.h). DeepSpeed's flag names, so existing job scripts keep working.
// Pure; main thread.
#pragma once

#include "base/status.h"
#include "launcher/options.h"

namespace dslaunch::launcher {

// Parses argv. Returns the options, or a Status: kInvalidArgument for bad
// usage (exit 64). `--help`/`--version` print and set *exit_now to 0.
StatusOr<LaunchOptions> ParseFlags(int argc, const char* const* argv,
                                   int* exit_now);

}  // namespace dslaunch::launcher
