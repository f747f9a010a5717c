// store_probe: a rank program for integration tests that exercises the job's
// key/value store through DSLAUNCH_STORE and reports what it saw.
//   store_probe   each rank sets rank/<r>, adds to "arrived", waits for
//                 every rank's key, checks values, prints "store ok <r>".
//   store_probe flood MIB DIR
//                 rank 0 first tries to store MIB values of 1 MiB each (far
//                 past the quota): it expects a refusal naming the quota and
//                 a 2 MiB value refused for its size, prints "flood refused
//                 ...", creates DIR/flooded, waits (up to 60 s) for DIR/go,
//                 deletes its values; then every rank rendezvouses as above.
#include <sys/stat.h>  // stat
#include <unistd.h>    // usleep

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include "proto/store_client.h"

using dslaunch::Status;
using dslaunch::StatusCode;
using dslaunch::proto::StoreClient;

static int Fail(const char* what, const Status& st) {
  std::fprintf(stderr, "store_probe: %s: %s\n", what, st.message().c_str());
  return 1;
}

static bool Has(const Status& st, const char* text) {
  return st.code() == StatusCode::kInvalidArgument &&
         st.message().find(text) != std::string::npos;
}

static bool WaitForFile(const std::string& path, int seconds) {
  struct stat sb;
  for (int i = 0; i < seconds * 100; ++i) {
    if (::stat(path.c_str(), &sb) == 0) return true;
    ::usleep(10000);
  }
  return false;
}

// Stores 1 MiB values until the store refuses; returns 0 when every refusal
// was the expected one.
static int Flood(StoreClient& store, int mib, const std::string& dir) {
  const std::string value(size_t{1} << 20, 'f');
  int stored = 0;
  Status refusal;
  for (; stored < mib; ++stored) {
    refusal = store.Set("flood/" + std::to_string(stored), value);
    if (!refusal.ok()) break;
  }
  if (refusal.ok() || !Has(refusal, "quota")) {
    return Fail("flood was not refused for the quota", refusal);
  }
  Status big = store.Set("flood/big", std::string(size_t{2} << 20, 'b'));
  if (!Has(big, "maximum value size")) {
    return Fail("2 MiB value was not refused for its size", big);
  }
  std::printf("flood refused after %d values: %s\n", stored,
              refusal.message().c_str());
  std::fflush(stdout);
  std::ofstream(dir + "/flooded") << stored << "\n";
  if (!WaitForFile(dir + "/go", 60)) {
    return Fail("flood", dslaunch::DeadlineExceeded("no " + dir + "/go"));
  }
  for (int i = 0; i < stored; ++i) {
    if (auto st = store.Delete("flood/" + std::to_string(i)); !st.ok()) {
      return Fail("delete", st);
    }
  }
  return 0;
}

static int Rendezvous(StoreClient& store, int rank, int world) {
  const std::string mine = "rank/" + std::to_string(rank);
  if (auto st = store.Set(mine, "value-" + std::to_string(rank)); !st.ok()) {
    return Fail("set", st);
  }
  auto added = store.Add("arrived", 1);
  if (!added.ok()) return Fail("add", added.status());
  std::vector<std::string> keys;
  for (int r = 0; r < world; ++r) keys.push_back("rank/" + std::to_string(r));
  if (auto st = store.Wait(keys, std::chrono::milliseconds(60000)); !st.ok()) {
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
      missing.status().code() != StatusCode::kDeadlineExceeded) {
    std::fprintf(stderr,
                 "store_probe: get of a missing key did not time out\n");
    return 1;
  }
  std::printf("store ok %d arrived=%lld\n", rank,
              static_cast<long long>(*added));
  return 0;
}

int main(int argc, char** argv) {
  const char* address = std::getenv("DSLAUNCH_STORE");
  const int rank = std::atoi(std::getenv("RANK") ? std::getenv("RANK") : "0");
  const int world =
      std::atoi(std::getenv("WORLD_SIZE") ? std::getenv("WORLD_SIZE") : "1");
  if (!address) return Fail("env", dslaunch::NotFound("DSLAUNCH_STORE unset"));
  StoreClient store;
  if (auto st = store.Connect(address); !st.ok()) return Fail("connect", st);
  const bool flood = argc == 4 && std::string(argv[1]) == "flood";
  if (flood && rank == 0) {
    if (int rc = Flood(store, std::atoi(argv[2]), argv[3]); rc != 0) return rc;
  }
  return Rendezvous(store, rank, world);
}
