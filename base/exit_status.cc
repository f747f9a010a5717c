#include "base/exit_status.h"

#include <signal.h>
#include <string.h>  // sigabbrev_np
#include <sys/wait.h>

namespace dslaunch {

int ExitStatusFor(const Status& status) {
  switch (status.code()) {
    case StatusCode::kOk:
      return kExitOk;
    case StatusCode::kInvalidArgument:
      return kExitUsage;
    case StatusCode::kDataError:
      return kExitDataError;
    case StatusCode::kNotFound:
      return kExitNoInput;
    case StatusCode::kUnavailable:
    case StatusCode::kProtocol:
    case StatusCode::kDeadlineExceeded:
      return kExitUnavailable;
    case StatusCode::kIoError:
      return kExitIoError;
    case StatusCode::kInternal:
      return kExitSoftware;
  }
  return kExitSoftware;
}

int ExitStatusForProcess(int exit_code, int signal) {
  return signal != 0 ? 128 + signal : exit_code;
}

std::string SignalName(int sig) {
  const char* abbrev = sigabbrev_np(sig);
  if (abbrev) return std::string("SIG") + abbrev;
  return "signal " + std::to_string(sig);
}

std::string DescribeExit(int exit_code, int signal) {
  if (signal != 0) return "was killed by " + SignalName(signal);
  return "exited with code " + std::to_string(exit_code);
}

std::string DescribeWaitStatus(int wait_status) {
  if (WIFSIGNALED(wait_status)) {
    std::string out = DescribeExit(0, WTERMSIG(wait_status));
    if (WCOREDUMP(wait_status)) out += " (core dumped)";
    return out;
  }
  return DescribeExit(WEXITSTATUS(wait_status), 0);
}

}  // namespace dslaunch
