// `dslaunch doctor`: the preflight of a job alone, printed as a table per
// node (name resolution, TCP connect, host key, authentication, remote agent
// and its version), with what to do about each failure. Runs on the calling
// thread with an io_context of its own.
#pragma once

#include "launcher/options.h"
#include "launcher/plan/plan.h"

namespace dslaunch::launcher {

// Returns the exit status: 0 when every node passed, 69 otherwise.
int RunDoctor(const LaunchOptions& options, const Plan& plan);

}  // namespace dslaunch::launcher
