// Time as seconds in a double: UnixSeconds, the wall clock, for every time
// on the wire, in metrics.jsonl and in event files; SteadySeconds, a clock
// that never jumps (NTP, a resumed VM), for ages and deadlines such as the
// launcher's view of the ranks (hangs, "last seen"). Any thread.
#pragma once

#include <chrono>

namespace dslaunch::base {

inline double UnixSeconds() {
  return std::chrono::duration<double>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

inline double SteadySeconds() {
  return std::chrono::duration<double>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

}  // namespace dslaunch::base
