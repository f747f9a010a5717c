#include "base/status.h"

#include <cstdio>   // fprintf
#include <cstring>  // strerror

namespace dslaunch {

std::string Status::ToString() const {
  if (ok()) return "OK";
  return message_;
}

Status Status::Annotate(const std::string& prefix) const {
  if (ok()) return *this;
  return Status(code_, prefix + ": " + message_);
}

Status ErrnoStatus(const std::string& what, int err) {
  return Status(StatusCode::kInternal, what + ": " + std::strerror(err));
}

Status IoErrno(const std::string& what, int err) {
  return IoError(what + ": " + std::strerror(err));
}

void CheckFailed(const char* file, int line, const char* what) {
  std::fprintf(stderr, "%s:%d: check failed: %s\n", file, line, what);
  std::abort();
}

}  // namespace dslaunch
