// KvStore: the job's key/value store, served by the launcher to every rank
// (through the agents) for rendezvous: set, blocking get, wait, add, check,
// delete. A request that must wait is parked with a deadline and answered
// when its keys appear or the deadline passes. Owned by the Launcher;
// io_context thread only.
#pragma once

#include <boost/asio/io_context.hpp>
#include <boost/asio/steady_timer.hpp>
#include <functional>
#include <map>
#include <memory>
#include <string>

#include "proto/dslaunch.pb.h"

namespace dslaunch::launcher {

class KvStore {
 public:
  using Reply = std::function<void(const wire::StoreResponse&)>;

  explicit KvStore(boost::asio::io_context& io) : io_(io) {}
  ~KvStore();

  // Handles one request; `reply` is called exactly once, possibly later.
  void Handle(const wire::StoreRequest& request, Reply reply);
  // Fails every parked request (e.g. on teardown) with `why`.
  void FailAll(const std::string& why);
  size_t size() const { return data_.size(); }

 private:
  struct Waiter {
    wire::StoreRequest request;
    Reply reply;
    std::unique_ptr<boost::asio::steady_timer> timer;
  };
  bool Ready(const wire::StoreRequest& request) const;
  wire::StoreResponse Answer(const wire::StoreRequest& request) const;
  void Park(const wire::StoreRequest& request, Reply reply);
  void WakeWaiters();

  boost::asio::io_context& io_;
  std::map<std::string, std::string> data_;
  // By park order. A timer's handler looks its waiter up by id: an expired
  // timer's queued handler may run after the waiter was answered.
  std::map<uint64_t, Waiter> waiters_;
  uint64_t next_waiter_ = 1;
};

}  // namespace dslaunch::launcher
