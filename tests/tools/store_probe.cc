// store_probe: a rank program for integration tests that exercises the job's
// key/value store through DSLAUNCH_STORE and reports what it saw.
//   store_probe   each rank sets rank/<r>, adds to "arrived", waits for
//                 every rank's key, checks values, prints "store ok <r>".
#include <cstdio>
#include <cstdlib>
#include <string>

#include "proto/store_client.h"

using dslaunch::proto::StoreClient;

static int Fail(const char* what, const dslaunch::Status& st) {
  std::fprintf(stderr, "store_probe: %s: %s\n", what, st.message().c_str());
  return 1;
}

int main() {
  const char* address = std::getenv("DSLAUNCH_STORE");
  const int rank = std::atoi(std::getenv("RANK") ? std::getenv("RANK") : "0");
  const int world =
      std::atoi(std::getenv("WORLD_SIZE") ? std::getenv("WORLD_SIZE") : "1");
  if (!address) return Fail("env", dslaunch::NotFound("DSLAUNCH_STORE unset"));
  StoreClient store;
  if (auto st = store.Connect(address); !st.ok()) return Fail("connect", st);
  const std::string mine = "rank/" + std::to_string(rank);
  if (auto st = store.Set(mine, "value-" + std::to_string(rank)); !st.ok()) {
    return Fail("set", st);
  }
  auto added = store.Add("arrived", 1);
  if (!added.ok()) return Fail("add", added.status());
  std::vector<std::string> keys;
  for (int r = 0; r < world; ++r) keys.push_back("rank/" + std::to_string(r));
  if (auto st = store.Wait(keys, std::chrono::milliseconds(20000)); !st.ok()) {
    return Fail("wait", st);
  }
  for (int r = 0; r < world; ++r) {
    auto v = store.Get(keys[r], std::chrono::milliseconds(1000));
    if (!v.ok()) return Fail("get", v.status());
    if (*v != "value-" + std::to_string(r)) {
      std::fprintf(stderr, "store_probe: rank/%d holds '%s'\n", r, v->c_str());
      return 1;
    }
  }
  auto missing = store.Get("never-set", std::chrono::milliseconds(50));
  if (missing.ok() ||
      missing.status().code() != dslaunch::StatusCode::kDeadlineExceeded) {
    std::fprintf(stderr,
                 "store_probe: get of a missing key did not time out\n");
    return 1;
  }
  std::printf("store ok %d arrived=%lld\n", rank,
              static_cast<long long>(*added));
  return 0;
}
