// Blocking client for the job's key/value store, for ranks. It speaks to the
// agent's store socket (DSLAUNCH_STORE="unix:PATH"); the agent relays each
// request over its authenticated connection to the launcher, so the rank
// needs no credentials. One request at a time; not thread-safe.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "base/status.h"
#include "proto/dslaunch.pb.h"

namespace dslaunch::proto {

// The Status a failed StoreResponse stands for: its error text, with a code
// from response.code(): TIMEOUT -> kDeadlineExceeded, LIMIT (a store quota;
// the text names the limit) and INVALID -> kInvalidArgument, CLOSED ->
// kUnavailable.
Status StoreError(const wire::StoreResponse& response);

class StoreClient {
 public:
  StoreClient() = default;
  ~StoreClient();
  StoreClient(const StoreClient&) = delete;
  StoreClient& operator=(const StoreClient&) = delete;

  // `address` as in DSLAUNCH_STORE: "unix:/path/to/store.sock".
  Status Connect(const std::string& address);

  // Every call fails with the launcher's error as a Status (see StoreError):
  // e.g. kInvalidArgument "store limit: value of ... (maximum value size)".
  Status Set(const std::string& key, const std::string& value);
  // Blocks until `key` exists (timeout 0 = forever; longer than 7 days is
  // clamped to 7 days; negative is an error).
  StatusOr<std::string> Get(const std::string& key,
                            std::chrono::milliseconds timeout);
  Status Wait(const std::vector<std::string>& keys,
              std::chrono::milliseconds timeout);
  // Adds `delta` to the integer at `key` (missing = 0); returns the new value.
  // A result outside int64 is an error and leaves the value as it was.
  StatusOr<int64_t> Add(const std::string& key, int64_t delta);
  StatusOr<bool> Check(const std::vector<std::string>& keys);
  Status Delete(const std::string& key);

 private:
  StatusOr<wire::StoreResponse> Call(wire::StoreRequest request);

  int fd_ = -1;
  uint64_t next_id_ = 1;
};

}  // namespace dslaunch::proto
