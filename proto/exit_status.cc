#include "proto/exit_status.h"

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

}  // namespace dslaunch
