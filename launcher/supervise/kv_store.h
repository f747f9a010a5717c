// KvStore: the job's key/value store, served by the launcher to every rank
// (through the agents) for rendezvous: set, blocking get, wait, add, check,
// delete. A request that must wait is parked with a deadline and answered
// when its keys appear or the deadline passes. Everything it holds is
// bounded by KvStoreLimits (one store per job); a request past a limit is
// refused with an error naming it. Owned by the Launcher; io_context thread
// only.
#pragma once

#include <boost/asio/io_context.hpp>
#include <boost/asio/steady_timer.hpp>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>

#include "proto/dslaunch.pb.h"

namespace dslaunch::launcher {

// Default limits, per job. Rendezvous values are small (an NCCL unique id is
// 128 bytes, a Gloo address a few hundred): 1024 ranks with dozens of keys
// each use well under 1% of these.
inline constexpr size_t kStoreMaxTotalBytes = size_t{64} << 20;  // keys+values
inline constexpr size_t kStoreMaxKeys = size_t{256} << 10;
inline constexpr size_t kStoreMaxKeyBytes = size_t{4} << 10;
inline constexpr size_t kStoreMaxValueBytes = size_t{1} << 20;
// Parked GET/WAIT requests, and the keys one WAIT/CHECK may name.
inline constexpr size_t kStoreMaxWaiters = size_t{16} << 10;
inline constexpr size_t kStoreMaxKeysPerRequest = size_t{16} << 10;
// Key bytes held by parked requests, each key counted with kParkedKeyCost.
inline constexpr size_t kStoreMaxParkedBytes = size_t{64} << 20;
inline constexpr size_t kStoreParkedKeyCost = 32;
// GET/WAIT timeouts above this are clamped to it (0 still waits forever;
// a negative timeout is refused).
inline constexpr std::chrono::milliseconds kStoreMaxTimeout =
    std::chrono::hours(24 * 7);

struct KvStoreLimits {
  size_t max_total_bytes = kStoreMaxTotalBytes;
  size_t max_keys = kStoreMaxKeys;
  size_t max_key_bytes = kStoreMaxKeyBytes;
  size_t max_value_bytes = kStoreMaxValueBytes;
  size_t max_waiters = kStoreMaxWaiters;
  size_t max_keys_per_request = kStoreMaxKeysPerRequest;
  size_t max_parked_bytes = kStoreMaxParkedBytes;
};

class KvStore {
 public:
  using Reply = std::function<void(const wire::StoreResponse&)>;

  explicit KvStore(boost::asio::io_context& io, KvStoreLimits limits = {})
      : io_(io), limits_(limits) {}
  ~KvStore();

  // Handles one request; `reply` is called exactly once, possibly later.
  void Handle(const wire::StoreRequest& request, Reply reply);
  // Fails every parked request (e.g. on teardown) with `why`.
  void FailAll(const std::string& why);
  // Fails every parked request and forgets every key: a fresh namespace
  // (the next generation of a restarted job).
  void Clear(const std::string& why);
  size_t size() const { return data_.size(); }
  // Bytes of keys and values held (what max_total_bytes bounds).
  size_t bytes() const { return bytes_; }
  size_t parked() const { return waiters_.size(); }
  size_t parked_bytes() const { return parked_bytes_; }

 private:
  struct Waiter {
    wire::StoreRequest request;  // id, op, keys and timeout only
    Reply reply;
    size_t cost = 0;  // its share of parked_bytes_
    int missing = 0;  // index of the key it watches: the first not yet seen
    std::unique_ptr<boost::asio::steady_timer> timer;
  };
  // Non-empty: the request breaks a limit or is malformed; the refusal.
  std::optional<wire::StoreResponse> Check(
      const wire::StoreRequest& request) const;
  void HandleAdd(const wire::StoreRequest& request, const Reply& reply);
  // Stores key=value if the quota allows; else the refusal.
  std::optional<wire::StoreResponse> Put(uint64_t id, const std::string& key,
                                         std::string value);
  bool Ready(const wire::StoreRequest& request) const;
  // Index of the first of request's keys at or after `from` that is not
  // stored; keys_size() when there is none.
  int FirstMissing(const wire::StoreRequest& request, int from) const;
  wire::StoreResponse Answer(const wire::StoreRequest& request) const;
  void Park(const wire::StoreRequest& request, Reply reply);
  void OnTimeout(uint64_t waiter_id);
  // `key` was stored: re-examines only the waiters watching it.
  void WakeWaiters(const std::string& key);
  // Removes `id` from the watchers of its current key.
  void Unwatch(uint64_t id, const Waiter& w);

  boost::asio::io_context& io_;
  const KvStoreLimits limits_;
  std::map<std::string, std::string> data_;
  size_t bytes_ = 0;  // sum of key and value sizes in data_
  // By park order. A timer's handler looks its waiter up by id: an expired
  // timer's queued handler may run after the waiter was answered.
  std::map<uint64_t, Waiter> waiters_;
  // Waiter ids by the key each waits for next: a SET looks at its key's
  // waiters only, so 1024 ranks waiting for 1024 keys cost O(keys) in all.
  std::map<std::string, std::set<uint64_t>> watchers_;
  size_t parked_bytes_ = 0;
  uint64_t next_waiter_ = 1;
};

}  // namespace dslaunch::launcher
