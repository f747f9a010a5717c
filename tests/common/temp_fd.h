// Test helpers for code that writes to a file descriptor (the terminal
// writer, the console): an unnamed temporary file and reading it back.
#ifndef DSLAUNCH_TESTS_COMMON_TEMP_FD_H_
#define DSLAUNCH_TESTS_COMMON_TEMP_FD_H_

#include <unistd.h>

#include <cstdio>
#include <string>

namespace dslaunch::testing {

// A descriptor of a new, unnamed temporary file (the FILE leaks; tests only).
inline int TempFd() { return ::dup(fileno(std::tmpfile())); }

// Everything written to `fd` so far, read from its start.
inline std::string ReadFd(int fd) {
  std::string out;
  char buf[65536];
  ::lseek(fd, 0, SEEK_SET);
  ssize_t n;
  while ((n = ::read(fd, buf, sizeof(buf))) > 0) out.append(buf, n);
  return out;
}

}  // namespace dslaunch::testing

#endif  // DSLAUNCH_TESTS_COMMON_TEMP_FD_H_
