#include <arpa/inet.h>   // inet_ntop
#include <netdb.h>       // getaddrinfo
#include <sys/socket.h>  // socket, connect, getsockname
#include <unistd.h>      // close

#include <cstdlib>
#include <cstring>
#include <vector>

#include "proto/store_client.h"
#include "worker/comm.h"

#if DSL_HAVE_GLOO
#include <gloo/allgather.h>
#include <gloo/allreduce.h>
#include <gloo/barrier.h>
#include <gloo/broadcast.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/prefix_store.h>
#include <gloo/rendezvous/store.h>
#include <gloo/transport/tcp/device.h>
#endif

namespace dslaunch::worker {

namespace {

class SingleRankComm : public Comm {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  Status AllReduceSum(float*, size_t) override { return Status::Ok(); }
  Status ReduceScatterSum(float* data, float* out, size_t chunk) override {
    if (data != out) std::memmove(out, data, chunk * sizeof(float));
    return Status::Ok();
  }
  Status AllGather(const float* in, float* out, size_t chunk) override {
    if (in != out) std::memmove(out, in, chunk * sizeof(float));
    return Status::Ok();
  }
  Status Broadcast(float*, size_t, int) override { return Status::Ok(); }
  Status Barrier() override { return Status::Ok(); }
};

// The address this host uses toward `peer` (an unsent UDP connect): the
// interface the other ranks can reach, even where the host name resolves to
// loopback.
std::string AddressToward(const std::string& peer) {
  addrinfo hints{};
  hints.ai_socktype = SOCK_DGRAM;
  addrinfo* res = nullptr;
  if (peer.empty() || ::getaddrinfo(peer.c_str(), "9", &hints, &res) != 0)
    return "";
  std::string out;
  int fd = ::socket(res->ai_family, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  sockaddr_storage a{};
  socklen_t len = sizeof(a);
  if (fd >= 0 && ::connect(fd, res->ai_addr, res->ai_addrlen) == 0 &&
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0) {
    char buf[INET6_ADDRSTRLEN] = {0};
    const void* ip = a.ss_family == AF_INET
                         ? static_cast<const void*>(
                               &reinterpret_cast<sockaddr_in*>(&a)->sin_addr)
                         : static_cast<const void*>(
                               &reinterpret_cast<sockaddr_in6*>(&a)->sin6_addr);
    if (::inet_ntop(a.ss_family, ip, buf, sizeof(buf))) out = buf;
  }
  if (fd >= 0) ::close(fd);
  ::freeaddrinfo(res);
  return out;
}

#if DSL_HAVE_GLOO

// Gloo's Store on the launcher's key/value store (through the agent).
class LauncherStore : public gloo::rendezvous::Store {
 public:
  LauncherStore(std::unique_ptr<proto::StoreClient> client,
                std::chrono::milliseconds timeout)
      : client_(std::move(client)), timeout_(timeout) {}
  void set(const std::string& key, const std::vector<char>& data) override {
    Check(client_->Set(key, std::string(data.begin(), data.end())), key);
  }
  std::vector<char> get(const std::string& key) override {
    auto value = client_->Get(key, timeout_);
    Check(value.status(), key);
    return std::vector<char>(value->begin(), value->end());
  }
  void wait(const std::vector<std::string>& keys) override {
    wait(keys, timeout_);
  }
  void wait(const std::vector<std::string>& keys,
            const std::chrono::milliseconds& timeout) override {
    Check(client_->Wait(keys, timeout), keys.empty() ? "" : keys[0]);
  }

 private:
  // Gloo's Store interface reports failure by exception; ConnectGloo
  // catches it at the edge.
  static void Check(const Status& st, const std::string& key) {
    if (!st.ok())
      throw std::runtime_error("store key '" + key + "': " + st.message());
  }
  std::unique_ptr<proto::StoreClient> client_;
  std::chrono::milliseconds timeout_;
};

class GlooComm : public Comm {
 public:
  explicit GlooComm(std::shared_ptr<gloo::rendezvous::Context> context)
      : context_(std::move(context)) {}
  int rank() const override { return context_->rank; }
  int size() const override { return context_->size; }

  Status AllReduceSum(float* data, size_t n) override {
    return Guard("all-reduce", [&] {
      gloo::AllreduceOptions opts(context_);
      opts.setOutput(data, n);
      opts.setReduceFunction(
          static_cast<void (*)(void*, const void*, const void*, size_t)>(
              &gloo::sum<float>));
      gloo::allreduce(opts);
    });
  }

  Status ReduceScatterSum(float* data, float* out, size_t chunk) override;

  Status AllGather(const float* in, float* out, size_t chunk) override {
    return Guard("all-gather", [&] {
      gloo::AllgatherOptions opts(context_);
      opts.setInput(const_cast<float*>(in), chunk);
      opts.setOutput(out, chunk * static_cast<size_t>(size()));
      gloo::allgather(opts);
    });
  }

  Status Broadcast(float* data, size_t n, int root) override {
    return Guard("broadcast", [&] {
      gloo::BroadcastOptions opts(context_);
      opts.setOutput(data, n);
      opts.setRoot(root);
      gloo::broadcast(opts);
    });
  }

  Status Barrier() override {
    return Guard("barrier", [&] {
      gloo::BarrierOptions opts(context_);
      gloo::barrier(opts);
    });
  }

 private:
  template <typename F>
  Status Guard(const char* what, F&& f) {
    try {
      f();
      return Status::Ok();
    } catch (const std::exception& e) {
      return Unavailable(std::string(what) + " failed: " + e.what());
    }
  }

  std::shared_ptr<gloo::rendezvous::Context> context_;
  std::vector<float> incoming_;  // one chunk from the left neighbour
};

// Ring reduce-scatter: in size()-1 steps every rank passes one partial chunk
// to its right neighbour and adds the one from its left; each link carries
// (size()-1)/size() of the data, as in NCCL's ring.
Status GlooComm::ReduceScatterSum(float* data, float* out, size_t chunk) {
  const int n = size(), r = rank();
  if (n > 1) {
    Status st = Guard("reduce-scatter", [&] {
      incoming_.resize(chunk);
      const size_t bytes = chunk * sizeof(float);
      auto send_buf = context_->createUnboundBuffer(data, bytes * n);
      auto recv_buf = context_->createUnboundBuffer(incoming_.data(), bytes);
      const int right = (r + 1) % n, left = (r + n - 1) % n;
      const auto timeout = context_->getTimeout();
      for (int step = 0; step < n - 1; ++step) {
        // Pass on the partial sum that ends `step + 1` ranks to the right;
        // add the one coming from the left into its chunk.
        const int send_chunk = (r - step - 1 + 2 * n) % n;
        const int recv_chunk = (r - step - 2 + 2 * n) % n;
        const uint64_t slot = context_->nextSlot();
        send_buf->send(right, slot, send_chunk * bytes, bytes);
        recv_buf->recv(left, slot, 0, bytes);
        recv_buf->waitRecv(timeout);
        send_buf->waitSend(timeout);
        float* acc = data + recv_chunk * chunk;
        for (size_t i = 0; i < chunk; ++i) acc[i] += incoming_[i];
      }
    });
    RETURN_IF_ERROR(st);
  }
  if (out != data + r * chunk)
    std::memmove(out, data + r * chunk, chunk * sizeof(float));
  return Status::Ok();
}

#endif  // DSL_HAVE_GLOO

}  // namespace

std::unique_ptr<Comm> MakeSingleRankComm() {
  return std::make_unique<SingleRankComm>();
}

StatusOr<std::unique_ptr<Comm>> ConnectGloo(const GlooOptions& o) {
#if DSL_HAVE_GLOO
  auto client = std::make_unique<proto::StoreClient>();
  RETURN_IF_ERROR(client->Connect(o.store_address));
  const auto timeout =
      std::chrono::milliseconds(static_cast<int64_t>(o.timeout_s * 1000));
  try {
    gloo::transport::tcp::attr attr;
    attr.hostname = o.bind_address;
    auto device = gloo::transport::tcp::CreateDevice(attr);
    LauncherStore store(std::move(client), timeout);
    gloo::rendezvous::PrefixStore prefixed(o.key_prefix, store);
    auto context = std::make_shared<gloo::rendezvous::Context>(o.rank, o.size);
    context->setTimeout(timeout);
    context->connectFullMesh(prefixed, device);
    return std::unique_ptr<Comm>(
        std::make_unique<GlooComm>(std::move(context)));
  } catch (const std::exception& e) {
    return Unavailable(std::string("gloo rendezvous failed: ") + e.what());
  }
#else
  (void)o;
  return Internal("this dsworker was built without Gloo");
#endif
}

StatusOr<std::unique_ptr<Comm>> CommFromEnvironment() {
  auto env = [](const char* k) -> std::string {
    const char* v = std::getenv(k);
    return v ? v : "";
  };
  GlooOptions o;
  o.size = env("WORLD_SIZE").empty() ? 1 : std::atoi(env("WORLD_SIZE").c_str());
  o.rank = std::atoi(env("RANK").c_str());
  if (o.size <= 1) return MakeSingleRankComm();
  o.store_address = env("DSLAUNCH_STORE");
  if (o.store_address.empty()) {
    return InvalidArgument(
        "WORLD_SIZE > 1 but DSLAUNCH_STORE is unset: start ranks with "
        "dslaunch");
  }
  o.key_prefix = env("DSLAUNCH_JOB_ID") + "/" +
                 env("TORCHELASTIC_RESTART_COUNT") + "/gloo";
  o.bind_address = AddressToward(env("MASTER_ADDR"));
  return ConnectGloo(o);
}

}  // namespace dslaunch::worker
