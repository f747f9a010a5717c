// Words for how a process ended: signal names instead of numbers, wait
// statuses and exit records in one sentence. Pure functions.
#pragma once

#include <string>

namespace dslaunch::launcher {

// "SIGTERM", "SIGKILL", ...; "signal 42" for ones without a name.
std::string SignalName(int sig);
// "exited with code 3" / "was killed by SIGSEGV (core dumped)".
std::string DescribeWaitStatus(int wait_status);
std::string DescribeExit(int exit_code, int signal);
// The launcher's exit status for a rank that ended so: code, or 128+signal.
int ExitStatusFor(int exit_code, int signal);

}  // namespace dslaunch::launcher
