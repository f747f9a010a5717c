// comm_probe: a rank program for integration tests. Connects the Gloo Comm
// through the launcher's store and checks every collective against what
// the sums must be; prints "comm ok <rank>/<size>" or fails with the reason.
#include <cmath>
#include <cstdio>
#include <vector>

#include "worker/comm.h"

using dslaunch::Status;

static int Fail(const char* what, const Status& st) {
  std::fprintf(stderr, "comm_probe: %s: %s\n", what, st.message().c_str());
  return 1;
}

static bool Near(float a, float b) {
  return std::fabs(a - b) <= 1e-4f * (1 + std::fabs(b));
}

int main() {
  auto comm = dslaunch::worker::CommFromEnvironment();
  if (!comm.ok()) return Fail("connect", comm.status());
  auto& c = **comm;
  const int r = c.rank(), n = c.size();
  const size_t chunk = 1001;  // odd on purpose
  std::vector<float> data(chunk * n);
  for (size_t i = 0; i < data.size(); ++i)
    data[i] = static_cast<float>(r + 1) * (i % 7);
  // All-reduce: element i becomes (sum of r+1) * (i % 7).
  std::vector<float> all = data;
  if (auto st = c.AllReduceSum(all.data(), all.size()); !st.ok())
    return Fail("all-reduce", st);
  const float ranks_sum = n * (n + 1) / 2.0f;
  for (size_t i = 0; i < all.size(); ++i) {
    if (!Near(all[i], ranks_sum * (i % 7))) return Fail("all-reduce", Status());
  }
  // Reduce-scatter: my chunk of the same sums.
  std::vector<float> mine(chunk);
  std::vector<float> work = data;  // clobbered
  if (auto st = c.ReduceScatterSum(work.data(), mine.data(), chunk); !st.ok()) {
    return Fail("reduce-scatter", st);
  }
  for (size_t i = 0; i < chunk; ++i) {
    if (!Near(mine[i], all[r * chunk + i])) {
      std::fprintf(stderr, "comm_probe: reduce-scatter element %zu: %f != %f\n",
                   i, mine[i], all[r * chunk + i]);
      return 1;
    }
  }
  // All-gather of the reduced chunks gives the all-reduce result back.
  std::vector<float> gathered(chunk * n);
  if (auto st = c.AllGather(mine.data(), gathered.data(), chunk); !st.ok()) {
    return Fail("all-gather", st);
  }
  if (gathered != all) return Fail("all-gather", Status());
  std::vector<float> b(5, static_cast<float>(r));
  if (auto st = c.Broadcast(b.data(), b.size(), n - 1); !st.ok())
    return Fail("broadcast", st);
  if (b[4] != static_cast<float>(n - 1)) return Fail("broadcast", Status());
  if (auto st = c.Barrier(); !st.ok()) return Fail("barrier", st);
  std::printf("comm ok %d/%d\n", r, n);
  return 0;
}
