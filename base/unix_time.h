// Time as seconds in a double: UnixSeconds, the wall clock, for every time
// on the wire, in metrics.jsonl and in event files; SteadySeconds, a clock
// that never jumps (NTP, a resumed VM), for ages and deadlines such as the
// launcher's view of the ranks (hangs, "last seen"). Any thread.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>

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

// A duration given in seconds (a flag, an option) as a timer's: whole
// milliseconds, within [0, 10^9 s] (NaN is 0).
inline std::chrono::milliseconds Millis(double seconds) {
  if (!(seconds > 0)) return std::chrono::milliseconds(0);
  return std::chrono::milliseconds(
      static_cast<int64_t>(std::min(seconds, 1e9) * 1000));
}

}  // namespace dslaunch::base
