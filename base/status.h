// Status and StatusOr<T>: how expected failures travel in dslaunch.
// A Status is a code plus a message meant for the user (it names the place:
// file:line, host, flag). Value type; any thread.
#pragma once

#include <cstdlib>
#include <optional>
#include <string>
#include <utility>
#include <variant>

namespace dslaunch {

enum class StatusCode {
  kOk = 0,
  kInvalidArgument,  // bad usage: flags, filters (sysexits 64)
  kDataError,        // bad hostfile, config or input data (65)
  kUnavailable,      // a node or agent unreachable or lost (69)
  kInternal,         // a bug or an OS failure we did not expect (70)
  kProtocol,         // a malformed or unauthenticated wire message
  kNotFound,
  kDeadlineExceeded,
  kIoError,  // a file could not be written (74)
};

class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(StatusCode code, std::string message)
      : code_(code), message_(std::move(message)) {}

  static Status Ok() { return Status(); }
  bool ok() const { return code_ == StatusCode::kOk; }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }
  std::string ToString() const;
  // Wraps the message with a prefix ("while X: <message>"), keeping the code.
  Status Annotate(const std::string& prefix) const;

 private:
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
};

inline Status InvalidArgument(std::string m) {
  return Status(StatusCode::kInvalidArgument, std::move(m));
}
inline Status DataError(std::string m) {
  return Status(StatusCode::kDataError, std::move(m));
}
inline Status Unavailable(std::string m) {
  return Status(StatusCode::kUnavailable, std::move(m));
}
inline Status Internal(std::string m) {
  return Status(StatusCode::kInternal, std::move(m));
}
inline Status ProtocolError(std::string m) {
  return Status(StatusCode::kProtocol, std::move(m));
}
inline Status NotFound(std::string m) {
  return Status(StatusCode::kNotFound, std::move(m));
}
inline Status DeadlineExceeded(std::string m) {
  return Status(StatusCode::kDeadlineExceeded, std::move(m));
}
inline Status IoError(std::string m) {
  return Status(StatusCode::kIoError, std::move(m));
}
// errno-based failure of an OS call: "what: strerror(err)".
Status ErrnoStatus(const std::string& what, int err);
// The same as an I/O error (sysexits 74): a file could not be made or written.
Status IoErrno(const std::string& what, int err);

// Holds either a value or a non-OK Status.
template <typename T>
class [[nodiscard]] StatusOr {
 public:
  StatusOr(T value) : value_(std::move(value)) {}         // NOLINT: implicit
  StatusOr(Status status) : status_(std::move(status)) {  // NOLINT: implicit
    if (status_.ok()) std::abort();  // an OK status carries no value
  }
  bool ok() const { return status_.ok(); }
  const Status& status() const { return status_; }
  T& value() & { return *value_; }
  const T& value() const& { return *value_; }
  T&& value() && { return std::move(*value_); }
  T* operator->() { return &*value_; }
  const T* operator->() const { return &*value_; }
  T& operator*() & { return *value_; }
  const T& operator*() const& { return *value_; }

 private:
  Status status_;
  std::optional<T> value_;
};

}  // namespace dslaunch

#define DSL_CONCAT_INNER(a, b) a##b
#define DSL_CONCAT(a, b) DSL_CONCAT_INNER(a, b)

#define RETURN_IF_ERROR(expr)                  \
  do {                                         \
    ::dslaunch::Status dsl_status_ = (expr);   \
    if (!dsl_status_.ok()) return dsl_status_; \
  } while (0)

#define ASSIGN_OR_RETURN_IMPL(tmp, lhs, expr) \
  auto tmp = (expr);                          \
  if (!tmp.ok()) return tmp.status();         \
  lhs = std::move(tmp).value()

// ASSIGN_OR_RETURN(auto x, FunctionReturningStatusOr());
#define ASSIGN_OR_RETURN(lhs, expr) \
  ASSIGN_OR_RETURN_IMPL(DSL_CONCAT(dsl_statusor_, __LINE__), lhs, expr)

// Broken invariants abort with file:line and a message.
#define DSL_CHECK(cond)                                              \
  do {                                                               \
    if (!(cond)) ::dslaunch::CheckFailed(__FILE__, __LINE__, #cond); \
  } while (0)

namespace dslaunch {
[[noreturn]] void CheckFailed(const char* file, int line, const char* what);
}  // namespace dslaunch
