#include "worker/comm_local.h"

#include <cstring>
#include <limits>
#include <string>
#include <thread>

namespace dslaunch::worker {

namespace {

constexpr float kPoison = std::numeric_limits<float>::quiet_NaN();

class LocalComm : public Comm {
 public:
  LocalComm(LocalWorld* world, int rank) : world_(world), rank_(rank) {}
  int rank() const override { return rank_; }
  int size() const override { return world_->size(); }

  Status AllReduceSum(float* data, size_t n) override {
    auto compute = [&](const std::vector<LocalWorld::Call>& calls) {
      result_.assign(calls[0].in, calls[0].in + n);
      for (size_t r = 1; r < calls.size(); ++r) {
        for (size_t i = 0; i < n; ++i) result_[i] += calls[r].in[i];
      }
    };
    return world_->Run(rank_, {"all-reduce", n, 0, data}, compute,
                       [&] { std::memcpy(data, result_.data(), n * 4); });
  }

  // The ring's order (comm_gloo.cc): chunk c's partial sum starts at rank
  // c+1, passes right through c+2, ..., and rank c adds its own last.
  Status ReduceScatterSum(float* data, float* out, size_t chunk) override {
    const int n = size(), c = rank_;
    auto compute = [&](const std::vector<LocalWorld::Call>& calls) {
      const size_t at = static_cast<size_t>(c) * chunk;
      const float* first = calls[(c + 1) % n].in + at;
      result_.assign(first, first + chunk);
      for (int k = 2; k <= n; ++k) {
        const float* next = calls[(c + k) % n].in + at;
        for (size_t i = 0; i < chunk; ++i) result_[i] += next[i];
      }
    };
    auto commit = [&] {
      // Gloo leaves partial sums in `data`; poison it so no caller relies
      // on what is left there.
      std::fill(data, data + chunk * n, kPoison);
      std::memcpy(out, result_.data(), chunk * 4);
    };
    return world_->Run(rank_, {"reduce-scatter", chunk, 0, data}, compute,
                       commit);
  }

  Status AllGather(const float* in, float* out, size_t chunk) override {
    auto compute = [&](const std::vector<LocalWorld::Call>& calls) {
      result_.resize(chunk * calls.size());
      for (size_t r = 0; r < calls.size(); ++r) {
        std::memcpy(result_.data() + r * chunk, calls[r].in, chunk * 4);
      }
    };
    return world_->Run(rank_, {"all-gather", chunk, 0, in}, compute, [&] {
      std::memcpy(out, result_.data(), result_.size() * 4);
    });
  }

  Status Broadcast(float* data, size_t n, int root) override {
    if (root < 0 || root >= size())
      return InvalidArgument("broadcast root out of range");
    auto compute = [&](const std::vector<LocalWorld::Call>& calls) {
      result_.assign(calls[root].in, calls[root].in + n);
    };
    return world_->Run(rank_, {"broadcast", n, root, data}, compute,
                       [&] { std::memcpy(data, result_.data(), n * 4); });
  }

  Status Barrier() override {
    return world_->Run(
        rank_, {"barrier", 0, 0, nullptr},
        [](const std::vector<LocalWorld::Call>&) {}, [] {});
  }

 private:
  LocalWorld* world_;
  const int rank_;
  std::vector<float> result_;  // this rank's output, until it is committed
};

}  // namespace

LocalWorld::LocalWorld(int size, std::chrono::milliseconds timeout)
    : size_(size),
      timeout_(timeout),
      calls_(size),
      count_(size, 0),
      fail_at_(size, 0) {
  DSL_CHECK(size >= 1);
}

LocalWorld::~LocalWorld() = default;

std::unique_ptr<Comm> LocalWorld::MakeComm(int rank) {
  DSL_CHECK(rank >= 0 && rank < size_);
  return std::make_unique<LocalComm>(this, rank);
}

void LocalWorld::FailAt(int rank, int64_t nth) {
  std::lock_guard<std::mutex> lock(mu_);
  fail_at_.at(rank) = nth;
}

int64_t LocalWorld::calls(int rank) const {
  std::lock_guard<std::mutex> lock(mu_);
  return count_.at(rank);
}

Status LocalWorld::Break(Status st) {
  if (broken_.ok()) broken_ = std::move(st);
  cv_.notify_all();
  return broken_;
}

Status LocalWorld::Arrive(std::unique_lock<std::mutex>& lock,
                          const char* what) {
  if (!broken_.ok()) return broken_;
  const uint64_t gen = generation_;
  if (++arrived_ == size_) {
    arrived_ = 0;
    ++generation_;
    cv_.notify_all();
    return Status::Ok();
  }
  const auto deadline = std::chrono::steady_clock::now() + timeout_;
  cv_.wait_until(lock, deadline,
                 [&] { return generation_ != gen || !broken_.ok(); });
  if (generation_ != gen) return Status::Ok();
  return Break(Unavailable(std::string(what) +
                           " failed: peers did not arrive within the timeout"));
}

Status LocalWorld::Run(
    int rank, const Call& call,
    const std::function<void(const std::vector<Call>&)>& compute,
    const std::function<void()>& commit) {
  std::unique_lock<std::mutex> lock(mu_);
  if (!broken_.ok()) return broken_;
  if (++count_[rank] == fail_at_[rank]) {
    return Break(Unavailable(std::string(call.op) + " failed: rank " +
                             std::to_string(rank) + " lost its connection"));
  }
  calls_[rank] = call;
  RETURN_IF_ERROR(Arrive(lock, call.op));
  for (const Call& c : calls_) {
    if (std::strcmp(c.op, call.op) != 0 || c.n != call.n ||
        c.root != call.root) {
      return Break(Unavailable(std::string(call.op) +
                               " failed: ranks called different collectives "
                               "or sizes"));
    }
  }
  const std::vector<Call> calls = calls_;  // stable until the second arrival
  lock.unlock();
  compute(calls);
  lock.lock();
  RETURN_IF_ERROR(Arrive(lock, call.op));
  lock.unlock();
  commit();
  return Status::Ok();
}

std::vector<Status> RunRanks(LocalWorld& world,
                             const std::function<Status(Comm&)>& fn) {
  std::vector<Status> results(world.size());
  std::vector<std::unique_ptr<Comm>> comms;
  for (int r = 0; r < world.size(); ++r) comms.push_back(world.MakeComm(r));
  std::vector<std::thread> threads;
  for (int r = 0; r < world.size(); ++r) {
    threads.emplace_back([&, r] { results[r] = fn(*comms[r]); });
  }
  for (auto& t : threads) t.join();
  return results;
}

std::unique_ptr<Comm> Borrow(Comm& comm) {
  struct Ref final : Comm {
    explicit Ref(Comm& c) : c(c) {}
    int rank() const override { return c.rank(); }
    int size() const override { return c.size(); }
    Status AllReduceSum(float* d, size_t n) override {
      return c.AllReduceSum(d, n);
    }
    Status ReduceScatterSum(float* d, float* o, size_t k) override {
      return c.ReduceScatterSum(d, o, k);
    }
    Status AllGather(const float* i, float* o, size_t k) override {
      return c.AllGather(i, o, k);
    }
    Status Broadcast(float* d, size_t n, int root) override {
      return c.Broadcast(d, n, root);
    }
    Status Barrier() override { return c.Barrier(); }
    Comm& c;
  };
  return std::make_unique<Ref>(comm);
}

}  // namespace dslaunch::worker
