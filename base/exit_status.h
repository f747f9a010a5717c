// Exit statuses of every dslaunch binary: sysexits codes
// for the programs' own failures, a rank's code or 128+signal for a rank's,
// 128+signal after a signal from outside (130 Ctrl-C, 143 SIGTERM). The one
// place where a Status or a process end becomes an exit status. Pure functions;
// any thread.
#pragma once

#include <string>

#include "base/status.h"

namespace dslaunch {

inline constexpr int kExitOk = 0;
inline constexpr int kExitUsage = 64;        // EX_USAGE: bad flags
inline constexpr int kExitDataError = 65;    // EX_DATAERR: hostfile, config
inline constexpr int kExitNoInput = 66;      // EX_NOINPUT: a file not found
inline constexpr int kExitUnavailable = 69;  // EX_UNAVAILABLE: node, agent
inline constexpr int kExitSoftware = 70;     // EX_SOFTWARE: internal error
inline constexpr int kExitIoError = 74;  // EX_IOERR: logs could not be written
inline constexpr int kExitHung = 124;    // --on_hang abort (timeout(1)'s code)
inline constexpr int kExitInterrupted = 130;  // 128 + SIGINT

// The exit status for a failure: kInvalidArgument 64, kDataError 65,
// kNotFound 66, kUnavailable/kProtocol/kDeadlineExceeded 69, kIoError 74,
// kInternal 70; OK is 0.
int ExitStatusFor(const Status& status);
// A process that ended with `exit_code`, or by `signal` when non-zero: the
// code itself, or 128 + signal, as a shell reports it.
int ExitStatusForProcess(int exit_code, int signal);

// Words for how a process ended, for reports and logs:
// "SIGTERM", "SIGKILL", ...; "signal 42" for ones without a name.
std::string SignalName(int sig);
// "exited with code 3" / "was killed by SIGABRT".
std::string DescribeExit(int exit_code, int signal);
// The same for a wait(2) status, with " (core dumped)" when it says so.
std::string DescribeWaitStatus(int wait_status);

}  // namespace dslaunch
