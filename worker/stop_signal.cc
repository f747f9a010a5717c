#include "worker/stop_signal.h"

#include <signal.h>
#include <unistd.h>  // _exit, write

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>  // memset
#include <thread>

namespace dslaunch::worker {

namespace {

// Lock-free atomics: safe in a signal handler, and read from other threads.
std::atomic<int> g_stop{0};
std::atomic<bool> g_agreed{false};
std::atomic<int64_t> g_last_step_ns{0};     // steady clock, 0 = none yet
std::atomic<int64_t> g_longest_step_ns{0};  // between two step ends

int64_t NowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

void OnStop(int sig) {
  int none = 0;
  g_stop.compare_exchange_strong(none, sig);
}

void Watch() {
  int64_t seen_at = 0;  // when the watchdog first saw the signal
  for (;;) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    const int sig = g_stop.load();
    if (sig == 0 || g_agreed.load()) continue;
    const int64_t now = NowNs();
    if (seen_at == 0) seen_at = now;
    const int64_t bound =
        std::max<int64_t>(2'000'000'000, 3 * g_longest_step_ns.load());
    const int64_t last = std::max(g_last_step_ns.load(), seen_at);
    if (now - last <= bound) continue;
    char msg[200];
    const int n = std::snprintf(
        msg, sizeof msg,
        "dsworker: stop signal %d and no step ended within %.1f s (blocked "
        "in a collective or the rendezvous?): exiting without a checkpoint\n",
        sig, static_cast<double>(bound) / 1e9);
    if (n > 0) (void)!::write(2, msg, static_cast<size_t>(n));
    ::_exit(128 + sig);
  }
}

}  // namespace

void CatchStopSignal() {
  struct sigaction sa;
  std::memset(&sa, 0, sizeof(sa));
  sa.sa_handler = OnStop;
  sigemptyset(&sa.sa_mask);
  // Collectives and file writes go on: the step ends before the stop.
  sa.sa_flags = SA_RESTART;
  ::sigaction(SIGTERM, &sa, nullptr);
  std::thread(Watch).detach();
}

int StopSignal() { return g_stop.load(); }

void NoteStepDone() {
  const int64_t now = NowNs();
  const int64_t last = g_last_step_ns.exchange(now);
  if (last != 0) {
    int64_t longest = g_longest_step_ns.load();
    while (now - last > longest &&
           !g_longest_step_ns.compare_exchange_weak(longest, now - last)) {
    }
  }
}

void NoteStopAgreed() { g_agreed.store(true); }

}  // namespace dslaunch::worker
