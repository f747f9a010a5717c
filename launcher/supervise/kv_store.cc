#include "launcher/supervise/kv_store.h"

#include <charconv>  // from_chars

namespace dslaunch::launcher {

using Op = wire::StoreRequest;
using Response = wire::StoreResponse;

KvStore::~KvStore() { FailAll("store shut down"); }

static wire::StoreResponse Error(uint64_t id,
                                 wire::StoreResponse::ErrorCode code,
                                 std::string error) {
  wire::StoreResponse r;
  r.set_id(id);
  r.set_ok(false);
  r.set_code(code);
  r.set_error(std::move(error));
  return r;
}

// A key as it appears in an error message: quoted, cut after 64 bytes.
static std::string Quote(const std::string& key) {
  constexpr size_t kShown = 64;
  if (key.size() <= kShown) return "'" + key + "'";
  return "'" + key.substr(0, kShown) + "...' (" + std::to_string(key.size()) +
         " bytes)";
}

static std::string Bytes(size_t n) {
  if (n >= (size_t{1} << 20) && n % (size_t{1} << 20) == 0) {
    return std::to_string(n >> 20) + " MiB";
  }
  if (n >= 1024 && n % 1024 == 0) return std::to_string(n >> 10) + " KiB";
  return std::to_string(n) + " bytes";
}

static wire::StoreResponse Limit(uint64_t id, const std::string& what) {
  return Error(id, Response::LIMIT, "store limit: " + what);
}

int KvStore::FirstMissing(const wire::StoreRequest& request, int from) const {
  int i = from;
  while (i < request.keys_size() && data_.count(request.keys(i))) ++i;
  return i;
}

bool KvStore::Ready(const wire::StoreRequest& request) const {
  return FirstMissing(request, 0) == request.keys_size();
}

wire::StoreResponse KvStore::Answer(const wire::StoreRequest& request) const {
  wire::StoreResponse r;
  r.set_id(request.id());
  r.set_ok(true);
  if (request.op() == Op::GET) r.set_value(data_.at(request.keys(0)));
  return r;
}

std::optional<wire::StoreResponse> KvStore::Check(
    const wire::StoreRequest& request) const {
  const uint64_t id = request.id();
  const bool one_key = request.op() == Op::SET || request.op() == Op::GET ||
                       request.op() == Op::ADD || request.op() == Op::DELETE;
  if (request.keys_size() == 0 || (one_key && request.keys_size() != 1)) {
    return Error(id, Response::INVALID,
                 "store request with a wrong number of keys");
  }
  if (static_cast<size_t>(request.keys_size()) > limits_.max_keys_per_request) {
    return Limit(id, "a request names " + std::to_string(request.keys_size()) +
                         " keys; at most " +
                         std::to_string(limits_.max_keys_per_request) +
                         " per request");
  }
  for (const auto& key : request.keys()) {
    if (key.size() <= limits_.max_key_bytes) continue;
    return Limit(id, "key " + Quote(key) + " is longer than " +
                         Bytes(limits_.max_key_bytes) + " (maximum key size)");
  }
  if ((request.op() == Op::GET || request.op() == Op::WAIT) &&
      request.timeout_ms() < 0) {
    return Error(id, Response::INVALID,
                 "store timeout of " + std::to_string(request.timeout_ms()) +
                     " ms is negative (0 waits forever)");
  }
  return std::nullopt;
}

std::optional<wire::StoreResponse> KvStore::Put(uint64_t id,
                                                const std::string& key,
                                                std::string value) {
  if (value.size() > limits_.max_value_bytes) {
    return Limit(id, "value of " + std::to_string(value.size()) +
                         " bytes for key " + Quote(key) + " is larger than " +
                         Bytes(limits_.max_value_bytes) +
                         " (maximum value size)");
  }
  auto it = data_.find(key);
  const size_t old = it == data_.end() ? 0 : key.size() + it->second.size();
  const size_t total = bytes_ - old + key.size() + value.size();
  if (it == data_.end() && data_.size() >= limits_.max_keys) {
    return Limit(id, "the job's store holds " + std::to_string(data_.size()) +
                         " keys, the maximum; cannot add key " + Quote(key));
  }
  if (total > limits_.max_total_bytes && total > bytes_) {
    return Limit(id, "storing key " + Quote(key) + " would hold " +
                         std::to_string(total) +
                         " bytes of keys and values, over the job's quota of " +
                         Bytes(limits_.max_total_bytes));
  }
  bytes_ = total;
  if (it == data_.end()) {
    data_.emplace(key, std::move(value));
  } else {
    it->second = std::move(value);
  }
  return std::nullopt;
}

void KvStore::Handle(const wire::StoreRequest& request, Reply reply) {
  if (auto refused = Check(request)) return reply(*refused);
  const std::string& key = request.keys(0);
  switch (request.op()) {
    case Op::SET:
      if (auto refused = Put(request.id(), key, request.value())) {
        return reply(*refused);
      }
      reply(Answer(request));
      return WakeWaiters(key);
    case Op::ADD:
      return HandleAdd(request, reply);
    case Op::CHECK: {
      wire::StoreResponse r = Answer(request);
      r.set_ready(Ready(request));
      return reply(r);
    }
    case Op::DELETE:
      if (auto it = data_.find(key); it != data_.end()) {
        bytes_ -= key.size() + it->second.size();
        data_.erase(it);
      }
      return reply(Answer(request));
    case Op::GET:
    case Op::WAIT:
      if (Ready(request)) return reply(Answer(request));
      return Park(request, std::move(reply));
    default:
      return reply(
          Error(request.id(), Response::INVALID, "unknown store operation"));
  }
}

// ADD refuses, rather than wraps or saturates, a result outside int64: a
// counter that silently stops counting would break whoever relies on it.
void KvStore::HandleAdd(const wire::StoreRequest& request, const Reply& reply) {
  const std::string& key = request.keys(0);
  int64_t value = 0;
  if (auto it = data_.find(key); it != data_.end()) {
    const std::string& s = it->second;
    auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), value);
    if (ec != std::errc() || end != s.data() + s.size()) {
      return reply(
          Error(request.id(), Response::INVALID,
                "store key " + Quote(key) + " does not hold a 64-bit integer"));
    }
  }
  int64_t sum = 0;
  if (__builtin_add_overflow(value, request.delta(), &sum)) {
    return reply(Error(request.id(), Response::INVALID,
                       "store ADD on key " + Quote(key) + ": " +
                           std::to_string(value) + " + " +
                           std::to_string(request.delta()) +
                           " overflows a 64-bit integer"));
  }
  if (auto refused = Put(request.id(), key, std::to_string(sum))) {
    return reply(*refused);
  }
  wire::StoreResponse r = Answer(request);
  r.set_value(std::to_string(sum));
  reply(r);
  WakeWaiters(key);
}

void KvStore::Park(const wire::StoreRequest& request, Reply reply) {
  size_t cost = 0;
  for (const auto& key : request.keys())
    cost += key.size() + kStoreParkedKeyCost;
  if (waiters_.size() >= limits_.max_waiters) {
    return reply(Limit(request.id(),
                       std::to_string(waiters_.size()) +
                           " requests already wait for keys, the maximum"));
  }
  if (parked_bytes_ + cost > limits_.max_parked_bytes) {
    return reply(Limit(request.id(), "waiting requests would hold more than " +
                                         Bytes(limits_.max_parked_bytes) +
                                         " of keys"));
  }
  const uint64_t id = next_waiter_++;
  Waiter& w = waiters_[id];
  w.request = request;
  w.request.clear_value();  // a GET's stray value is not kept while it waits
  w.reply = std::move(reply);
  w.cost = cost;
  w.missing = FirstMissing(request, 0);
  watchers_[request.keys(w.missing)].insert(id);
  parked_bytes_ += cost;
  if (request.timeout_ms() == 0) return;  // forever
  // Clamped before the conversion to the clock's nanoseconds, which would
  // overflow int64 above about 106 days.
  const auto timeout = std::min(std::chrono::milliseconds(request.timeout_ms()),
                                kStoreMaxTimeout);
  w.request.set_timeout_ms(timeout.count());
  w.timer = std::make_unique<boost::asio::steady_timer>(io_, timeout);
  w.timer->async_wait([this, id](const boost::system::error_code& ec) {
    if (!ec) OnTimeout(id);
  });
}

void KvStore::OnTimeout(uint64_t waiter_id) {
  auto it = waiters_.find(waiter_id);
  if (it == waiters_.end()) return;  // answered or failed meanwhile
  Waiter expired = std::move(it->second);
  waiters_.erase(it);
  Unwatch(waiter_id, expired);
  parked_bytes_ -= expired.cost;
  const auto& r = expired.request;
  const int missing = std::min(FirstMissing(r, 0), r.keys_size() - 1);
  expired.reply(Error(r.id(), Response::TIMEOUT,
                      "timeout after " + std::to_string(r.timeout_ms()) +
                          " ms waiting for key " + Quote(r.keys(missing))));
}

void KvStore::Unwatch(uint64_t id, const Waiter& w) {
  auto it = watchers_.find(w.request.keys(w.missing));
  if (it == watchers_.end()) return;
  it->second.erase(id);
  if (it->second.empty()) watchers_.erase(it);
}

void KvStore::WakeWaiters(const std::string& key) {
  auto watching = watchers_.find(key);
  if (watching == watchers_.end()) return;
  const std::set<uint64_t> ids = std::move(watching->second);
  watchers_.erase(watching);
  std::vector<Waiter> ready;
  for (uint64_t id : ids) {
    auto it = waiters_.find(id);
    if (it == waiters_.end()) continue;
    Waiter& w = it->second;
    w.missing = FirstMissing(w.request, w.missing);
    // A key seen earlier may have been deleted since: check them all once.
    if (w.missing == w.request.keys_size())
      w.missing = FirstMissing(w.request, 0);
    if (w.missing < w.request.keys_size()) {
      watchers_[w.request.keys(w.missing)].insert(id);
      continue;
    }
    parked_bytes_ -= w.cost;
    ready.push_back(std::move(w));
    waiters_.erase(it);
  }
  for (auto& w : ready) {
    if (w.timer) w.timer->cancel();
    w.reply(Answer(w.request));
  }
}

void KvStore::Clear(const std::string& why) {
  FailAll(why);
  data_.clear();
  bytes_ = 0;
}

void KvStore::FailAll(const std::string& why) {
  auto waiters = std::move(waiters_);
  waiters_.clear();
  watchers_.clear();
  parked_bytes_ = 0;
  for (auto& [id, w] : waiters) {
    if (w.timer) w.timer->cancel();
    w.reply(Error(w.request.id(), Response::CLOSED, why));
  }
}

}  // namespace dslaunch::launcher
