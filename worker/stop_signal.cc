#include "worker/stop_signal.h"

#include <signal.h>

#include <cstring>  // memset

namespace dslaunch::worker {

namespace {

volatile sig_atomic_t g_stop = 0;

void OnStop(int sig) {
  if (g_stop == 0) g_stop = sig;
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
}

int StopSignal() { return g_stop; }

void SetStopSignalForTest(int sig) { g_stop = sig; }

}  // namespace dslaunch::worker
