#include "launcher/kv_store.h"

namespace dslaunch::launcher {

KvStore::~KvStore() { FailAll("store shut down"); }

static wire::StoreResponse Error(uint64_t id, std::string error) {
  wire::StoreResponse r;
  r.set_id(id);
  r.set_ok(false);
  r.set_error(std::move(error));
  return r;
}

bool KvStore::Ready(const wire::StoreRequest& request) const {
  for (const auto& key : request.keys()) {
    if (!data_.count(key)) return false;
  }
  return true;
}

wire::StoreResponse KvStore::Answer(const wire::StoreRequest& request) const {
  wire::StoreResponse r;
  r.set_id(request.id());
  r.set_ok(true);
  if (request.op() == wire::StoreRequest::GET) {
    r.set_value(data_.at(request.keys(0)));
  }
  return r;
}

void KvStore::Handle(const wire::StoreRequest& request, Reply reply) {
  using Op = wire::StoreRequest;
  const bool one_key = request.op() == Op::SET || request.op() == Op::GET ||
                       request.op() == Op::ADD || request.op() == Op::DELETE;
  if (request.keys_size() == 0 || (one_key && request.keys_size() != 1)) {
    return reply(
        Error(request.id(), "store request with a wrong number of keys"));
  }
  const std::string& key = request.keys(0);
  switch (request.op()) {
    case Op::SET:
      data_[key] = request.value();
      reply(Answer(request));
      return WakeWaiters();
    case Op::ADD: {
      int64_t value = 0;
      auto it = data_.find(key);
      if (it != data_.end()) {
        try {
          value = std::stoll(it->second);
        } catch (...) {
          return reply(Error(request.id(), "store key '" + key +
                                               "' does not hold an integer"));
        }
      }
      value += request.delta();
      data_[key] = std::to_string(value);
      wire::StoreResponse r = Answer(request);
      r.set_value(data_[key]);
      reply(r);
      return WakeWaiters();
    }
    case Op::CHECK: {
      wire::StoreResponse r = Answer(request);
      r.set_ready(Ready(request));
      return reply(r);
    }
    case Op::DELETE:
      data_.erase(key);
      return reply(Answer(request));
    case Op::GET:
    case Op::WAIT:
      if (Ready(request)) return reply(Answer(request));
      return Park(request, std::move(reply));
    default:
      return reply(Error(request.id(), "unknown store operation"));
  }
}

void KvStore::Park(const wire::StoreRequest& request, Reply reply) {
  const uint64_t id = next_waiter_++;
  Waiter& w = waiters_[id];
  w.request = request;
  w.reply = std::move(reply);
  if (request.timeout_ms() <= 0) return;
  w.timer = std::make_unique<boost::asio::steady_timer>(
      io_, std::chrono::milliseconds(request.timeout_ms()));
  w.timer->async_wait([this, id](const boost::system::error_code& ec) {
    auto it = waiters_.find(id);
    if (ec || it == waiters_.end()) return;  // answered or failed meanwhile
    Waiter expired = std::move(it->second);
    waiters_.erase(it);
    expired.reply(
        Error(expired.request.id(),
              "timeout after " + std::to_string(expired.request.timeout_ms()) +
                  " ms waiting for key '" + expired.request.keys(0) + "'"));
  });
}

void KvStore::WakeWaiters() {
  std::vector<Waiter> ready;
  for (auto it = waiters_.begin(); it != waiters_.end();) {
    if (!Ready(it->second.request)) {
      ++it;
      continue;
    }
    ready.push_back(std::move(it->second));
    it = waiters_.erase(it);
  }
  for (auto& w : ready) {
    if (w.timer) w.timer->cancel();
    w.reply(Answer(w.request));
  }
}

void KvStore::FailAll(const std::string& why) {
  auto waiters = std::move(waiters_);
  waiters_.clear();
  for (auto& [id, w] : waiters) {
    if (w.timer) w.timer->cancel();
    w.reply(Error(w.request.id(), why));
  }
}

}  // namespace dslaunch::launcher
