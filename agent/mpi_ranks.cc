#include "agent/mpi_ranks.h"

#include <poll.h>
#include <spdlog/spdlog.h>
#include <sys/prctl.h>   // PR_SET_PDEATHSIG
#include <sys/socket.h>  // SO_PEERCRED
#include <sys/un.h>
#include <unistd.h>  // environ

#include <algorithm>
#include <boost/asio/post.hpp>
#include <boost/asio/read.hpp>
#include <boost/asio/write.hpp>
#include <cerrno>
#include <charconv>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <thread>

#include "base/exit_status.h"
#include "base/process_tree.h"  // ParentOf
#include "base/unix_socket.h"   // WriteAll
#include "proto/auth.h"

namespace dslaunch::agent {

namespace asio = boost::asio;
using Local = asio::local::stream_protocol;

namespace {

constexpr const char* kVersionField = "dslaunch-mpi-holder-1";
constexpr double kRegistrationDeadlineS = 10;
constexpr char kRegistered = 'R';
constexpr char kReleased = 'E';
constexpr char kRefused = 'X';

bool ParseInt(std::string_view s, int* out) {
  if (s.empty() || s.size() > 9) return false;
  auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), *out);
  return ec == std::errc() && end == s.data() + s.size() && *out >= 0;
}

std::string Proof(const std::string& key, const std::string& job_id,
                  int world_rank) {
  return proto::HexEncode(proto::HmacSha256(
      key, "dslaunch mpi holder " + job_id + " " + std::to_string(world_rank)));
}

// Empty when the process at the other end of the Unix socket `fd` runs as
// our user and has our parent (mpirun's daemon on this node started us
// both); else why it may not be trusted.
std::string CheckSibling(int fd) {
  // Orphans share init (or a subreaper) as their parent: not a proof.
  if (::getppid() == 1) return "our parent (mpirun's daemon) is gone";
  ucred cred{};
  socklen_t len = sizeof(cred);
  if (::getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0)
    return std::string("no peer credentials: ") + std::strerror(errno);
  if (cred.uid != ::geteuid())
    return "process " + std::to_string(cred.pid) + " runs as uid " +
           std::to_string(cred.uid) + ", not as ours";
  if (base::ParentOf(cred.pid) != ::getppid())
    return "process " + std::to_string(cred.pid) +
           " was not started by the same mpirun daemon";
  return "";
}

// Seconds as milliseconds, clamped to [0, one day] (NaN: 0).
std::chrono::milliseconds Millis(double seconds) {
  if (!(seconds > 0)) return std::chrono::milliseconds(0);
  return std::chrono::milliseconds(
      static_cast<int64_t>(std::min(seconds, 86400.0) * 1000));
}

std::string AbstractName(const std::string& name) {
  return std::string(1, '\0') + name;
}

std::vector<std::string_view> SplitFields(std::string_view payload) {
  std::vector<std::string_view> fields;
  size_t start = 0;
  while (start <= payload.size()) {
    size_t end = payload.find('\0', start);
    if (end == std::string_view::npos) end = payload.size();
    fields.push_back(payload.substr(start, end - start));
    start = end + 1;
  }
  return fields;
}

}  // namespace

StatusOr<std::vector<int>> ParseNodeSlots(const std::string& csv) {
  std::vector<int> slots;
  size_t start = 0;
  while (start <= csv.size()) {
    size_t end = csv.find(',', start);
    if (end == std::string::npos) end = csv.size();
    const std::string_view entry(csv.data() + start, end - start);
    int n = 0;
    if (!ParseInt(entry, &n) || n < 1 || n > 4096) {
      return InvalidArgument("--node_slots '" + csv + "': entry " +
                             std::to_string(slots.size() + 1) + " ('" +
                             std::string(entry) +
                             "') is not a slot count from 1 to 4096");
    }
    slots.push_back(n);
    if (slots.size() > 65536)
      return InvalidArgument("--node_slots: more than 65536 nodes");
    start = end + 1;
  }
  return slots;
}

StatusOr<MpiPlacement> MpiPlacementFrom(const GetEnv& env,
                                        const std::vector<int>& node_slots) {
  auto read = [&](const char* name, int* out) -> Status {
    const char* v = env(name);
    if (v == nullptr) {
      return InvalidArgument(std::string(name) +
                             " is not set: --from_mpirun is for processes "
                             "that OpenMPI's mpirun started");
    }
    if (!ParseInt(v, out))
      return InvalidArgument(std::string(name) + "='" + v + "' is not a rank");
    return Status::Ok();
  };
  MpiPlacement p;
  int world_size = 0;
  RETURN_IF_ERROR(read("OMPI_COMM_WORLD_RANK", &p.world_rank));
  RETURN_IF_ERROR(read("OMPI_COMM_WORLD_SIZE", &world_size));
  RETURN_IF_ERROR(read("OMPI_COMM_WORLD_LOCAL_RANK", &p.local_rank));
  RETURN_IF_ERROR(read("OMPI_COMM_WORLD_LOCAL_SIZE", &p.local_size));
  int64_t planned = 0;
  for (int s : node_slots) planned += s;
  if (world_size != planned) {
    return InvalidArgument("mpirun started " + std::to_string(world_size) +
                           " processes; the plan has " +
                           std::to_string(planned) + " ranks");
  }
  if (p.local_rank >= p.local_size || p.local_rank > p.world_rank) {
    return InvalidArgument("mpirun's local rank " +
                           std::to_string(p.local_rank) + " of " +
                           std::to_string(p.local_size) + " for MPI rank " +
                           std::to_string(p.world_rank) + " is not possible");
  }
  p.first_rank = p.world_rank - p.local_rank;
  int first = 0;
  for (size_t i = 0; i < node_slots.size(); ++i) {
    if (first == p.first_rank && node_slots[i] == p.local_size) {
      p.node_rank = static_cast<int>(i);
      return p;
    }
    first += node_slots[i];
  }
  std::string plan;
  for (int s : node_slots)
    plan += (plan.empty() ? "" : ",") + std::to_string(s);
  return InvalidArgument(
      "mpirun placed MPI rank " + std::to_string(p.world_rank) +
      " as local rank " + std::to_string(p.local_rank) + " of " +
      std::to_string(p.local_size) + " on its node, not as the plan (ranks " +
      "node by node, slots " + plan +
      "); do --launcher_args change mpirun's mapping?");
}

bool IsMpiVariable(std::string_view entry) {
  static constexpr std::string_view kPrefixes[] = {"OMPI_", "PMIX_", "OPAL_",
                                                   "ORTE_", "PRTE_"};
  for (auto prefix : kPrefixes) {
    if (entry.substr(0, prefix.size()) == prefix) return true;
  }
  return false;
}

std::vector<std::string> MpiVariables(const char* const* env) {
  std::vector<std::string> out;
  for (; env != nullptr && *env != nullptr; ++env) {
    std::string_view entry(*env);
    if (IsMpiVariable(entry) && entry.find('=') != std::string_view::npos)
      out.emplace_back(entry);
  }
  return out;
}

std::string MpiSocketName(const std::string& key, const std::string& job_id,
                          int first_rank) {
  return "dslaunch-mpi-" +
         proto::HexEncode(
             proto::HmacSha256(key, "mpi-socket " + job_id + " " +
                                        std::to_string(first_rank)))
             .substr(0, 32);
}

// ---------------------------------------------------------------- agent side

struct MpiHolders::Holder {
  explicit Holder(asio::io_context& io) : socket(io), deadline(io) {}
  Local::socket socket;
  asio::steady_timer deadline;
  unsigned char header[4] = {0, 0, 0, 0};
  std::string payload;
  char byte = 0;
  int local_rank = -1;
  int world_rank = -1;
  std::vector<std::string> vars;
};

MpiHolders::MpiHolders(asio::io_context& io, std::string job_id,
                       std::string key, MpiPlacement me)
    : io_(io),
      job_id_(std::move(job_id)),
      key_(std::move(key)),
      me_(me),
      acceptor_(io),
      ready_timer_(io),
      accept_retry_(io) {}

MpiHolders::~MpiHolders() {
  *alive_ = false;
  Release();
}

Status MpiHolders::Listen() {
  if (me_.local_size <= 1) return Status::Ok();  // no holder to wait for
  const std::string name = MpiSocketName(key_, job_id_, me_.first_rank);
  boost::system::error_code ec;
  acceptor_.open(Local(), ec);
  if (!ec) acceptor_.bind(Local::endpoint(AbstractName(name)), ec);
  if (!ec) acceptor_.listen(64, ec);
  if (ec) {
    return Unavailable("cannot listen for this node's MPI processes on @" +
                       name + ": " + ec.message());
  }
  Accept();
  return Status::Ok();
}

void MpiHolders::Accept() {
  auto h = std::make_shared<Holder>(io_);
  acceptor_.async_accept(
      h->socket, [this, h, alive = alive_](boost::system::error_code ec) {
        if (!*alive || ec == asio::error::operation_aborted) return;
        if (ec) {  // out of descriptors, say: try again shortly, never spin
          accept_retry_.expires_after(std::chrono::milliseconds(100));
          accept_retry_.async_wait(
              [this, alive](const boost::system::error_code& e) {
                if (*alive && !e) Accept();
              });
          return;
        }
        {
          const std::string why = CheckSibling(h->socket.native_handle());
          if (!why.empty()) {
            Refuse(h, why);
          } else if (pending_.size() + holders_.size() + 1 >=
                     static_cast<size_t>(me_.local_size)) {
            Refuse(h, "every MPI process of this node has registered");
          } else {
            ReadRegistration(h);
          }
        }
        Accept();
      });
}

void MpiHolders::Refuse(const std::shared_ptr<Holder>& h,
                        const std::string& why) {
  if (++refused_ <= 10) spdlog::warn("refused an MPI process: {}", why);
  std::erase(pending_, h);
  const std::string reply = std::string(1, kRefused) + why;
  boost::system::error_code ec;
  (void)::send(h->socket.native_handle(), reply.data(), reply.size(),
               MSG_DONTWAIT | MSG_NOSIGNAL);
  h->deadline.cancel();
  h->socket.close(ec);
}

void MpiHolders::ReadRegistration(const std::shared_ptr<Holder>& h) {
  pending_.push_back(h);
  h->deadline.expires_after(Millis(kRegistrationDeadlineS));
  h->deadline.async_wait(
      [this, h, alive = alive_](const boost::system::error_code& ec) {
        // Registered in the same turn the deadline passed: not refused.
        if (!*alive || ec ||
            std::find(pending_.begin(), pending_.end(), h) == pending_.end())
          return;
        Refuse(h, fmt::format("no registration within {:g} s",
                              kRegistrationDeadlineS));
      });
  asio::async_read(
      h->socket, asio::buffer(h->header),
      [this, h, alive = alive_](boost::system::error_code ec, size_t) {
        if (!*alive || !h->socket.is_open()) return;
        if (ec) return Refuse(h, "registration cut short: " + ec.message());
        const uint32_t n = (uint32_t{h->header[0]} << 24) |
                           (uint32_t{h->header[1]} << 16) |
                           (uint32_t{h->header[2]} << 8) | h->header[3];
        if (n == 0 || n > kMaxRegistrationBytes) {
          return Refuse(h, "registration of " + std::to_string(n) +
                               " bytes (at most " +
                               std::to_string(kMaxRegistrationBytes) + ")");
        }
        h->payload.resize(n);
        asio::async_read(
            h->socket, asio::buffer(h->payload),
            [this, h, alive](boost::system::error_code ec2, size_t) {
              if (!*alive || !h->socket.is_open()) return;
              if (ec2)
                return Refuse(h, "registration cut short: " + ec2.message());
              Register(h, std::move(h->payload));
            });
      });
}

void MpiHolders::Register(const std::shared_ptr<Holder>& h,
                          std::string payload) {
  const auto fields = SplitFields(payload);
  int world = -1, local = -1;
  if (fields.size() < 4 || fields[0] != kVersionField ||
      !ParseInt(fields[1], &world) || !ParseInt(fields[2], &local)) {
    return Refuse(h, "not a registration of this dsagent version");
  }
  if (!proto::ConstantTimeEqual(fields[3], Proof(key_, job_id_, world)))
    return Refuse(h, "wrong MPI key");
  if (local < 1 || local >= me_.local_size || world != me_.first_rank + local) {
    return Refuse(h, "MPI rank " + std::to_string(world) + " as local rank " +
                         std::to_string(local) + " does not belong to node " +
                         std::to_string(me_.node_rank));
  }
  if (holders_.count(local)) {
    return Refuse(
        h, "local rank " + std::to_string(local) + " has registered already");
  }
  for (size_t i = 4; i < fields.size(); ++i) {
    if (fields[i].empty()) continue;
    if (!IsMpiVariable(fields[i]) ||
        fields[i].find('=') == std::string_view::npos) {
      return Refuse(h, "'" + std::string(fields[i].substr(0, 40)) +
                           "' is not an MPI runtime variable");
    }
    h->vars.emplace_back(fields[i]);
  }
  h->deadline.cancel();
  std::erase(pending_, h);
  h->local_rank = local;
  h->world_rank = world;
  holders_[local] = h;
  static const char kOk = kRegistered;
  boost::system::error_code ec;
  asio::write(h->socket, asio::buffer(&kOk, 1), ec);
  // The holder never writes again: reading tells when it goes away.
  h->socket.async_read_some(
      asio::buffer(&h->byte, 1),
      [h, alive = alive_](boost::system::error_code ec2, size_t) {
        if (!*alive || !h->socket.is_open()) return;
        spdlog::warn(
            "the MPI process of local rank {} (MPI rank {}) ended before the "
            "job did ({}): mpirun is ending the job",
            h->local_rank, h->world_rank, ec2 ? ec2.message() : "wrote");
      });
  if (holders_.size() + 1 >= static_cast<size_t>(me_.local_size))
    StopListening();
  MaybeReady();
}

void MpiHolders::StopListening() {
  boost::system::error_code ec;
  acceptor_.close(ec);
  accept_retry_.cancel();
  for (auto& h : std::vector<std::shared_ptr<Holder>>(pending_))
    Refuse(h, "every MPI process of this node has registered");
  std::fill(key_.begin(), key_.end(), '\0');
  key_.clear();
}

void MpiHolders::WhenReady(double timeout_s,
                           std::function<void(Status)> ready) {
  ready_ = std::move(ready);
  ready_timer_.expires_after(Millis(timeout_s));
  ready_timer_.async_wait(
      [this, timeout_s, alive = alive_](const boost::system::error_code& ec) {
        if (!*alive || ec || !ready_) return;
        std::string missing;
        for (int l = 1; l < me_.local_size; ++l) {
          if (!holders_.count(l))
            missing += (missing.empty() ? "" : ", ") +
                       std::to_string(me_.first_rank + l);
        }
        auto ready = std::move(ready_);
        ready_ = nullptr;
        ready(Unavailable("the MPI processes of ranks " + missing +
                          " did not register with node " +
                          std::to_string(me_.node_rank) + "'s agent within " +
                          fmt::format("{:g}", timeout_s) + " s"));
      });
  MaybeReady();
}

void MpiHolders::MaybeReady() {
  if (!ready_ || holders_.size() + 1 < static_cast<size_t>(me_.local_size))
    return;
  ready_timer_.cancel();
  auto ready = std::move(ready_);
  ready_ = nullptr;
  asio::post(io_, [ready = std::move(ready), alive = alive_] {
    if (*alive) ready(Status::Ok());
  });
}

const std::vector<std::string>& MpiHolders::VariablesOf(int local_rank) const {
  static const std::vector<std::string> kNone;
  auto it = holders_.find(local_rank);
  return it == holders_.end() ? kNone : it->second->vars;
}

int MpiHolders::WorldRankOf(int local_rank) const {
  if (local_rank == 0) return me_.world_rank;
  auto it = holders_.find(local_rank);
  return it == holders_.end() ? -1 : it->second->world_rank;
}

void MpiHolders::Release() {
  boost::system::error_code ec;
  acceptor_.close(ec);
  ready_timer_.cancel();
  accept_retry_.cancel();
  for (auto& [local, h] : holders_) {
    if (!h->socket.is_open()) continue;
    (void)::send(h->socket.native_handle(), &kReleased, 1,
                 MSG_DONTWAIT | MSG_NOSIGNAL);
    h->socket.close(ec);
  }
  for (auto& h : pending_) {
    h->deadline.cancel();
    h->socket.close(ec);
  }
  pending_.clear();
}

// --------------------------------------------------------------- holder side

static int HolderFails(const MpiPlacement& me, int code,
                       const std::string& why) {
  std::fprintf(stderr, "dsagent (MPI rank %d, node %d): %s\n", me.world_rank,
               me.node_rank, why.c_str());
  return code;
}

int RunMpiHolder(const std::string& job_id, const std::string& key,
                 const MpiPlacement& me, double timeout_s) {
  ::prctl(PR_SET_PDEATHSIG, SIGTERM);  // mpirun's daemon gone: so are we
  const std::string name =
      AbstractName(MpiSocketName(key, job_id, me.first_rank));
  static_assert(sizeof(sockaddr_un::sun_path) > 64);  // the name is 45 bytes
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, name.data(), name.size());
  const auto addr_len =
      static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + name.size());
  const auto deadline = std::chrono::steady_clock::now() + Millis(timeout_s);
  int fd = -1;
  auto delay = std::chrono::milliseconds(5);
  while (true) {
    fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return HolderFails(me, kExitUnavailable, std::strerror(errno));
    if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), addr_len) == 0) break;
    const int err = errno;
    ::close(fd);
    if (err != ECONNREFUSED && err != ENOENT && err != EAGAIN)
      return HolderFails(me, kExitUnavailable, std::strerror(err));
    if (std::chrono::steady_clock::now() >= deadline) {
      return HolderFails(me, kExitUnavailable,
                         "the agent of this node (MPI rank " +
                             std::to_string(me.first_rank) +
                             ") did not listen within " +
                             fmt::format("{:g}", timeout_s) + " s");
    }
    std::this_thread::sleep_for(delay);
    delay = std::min(delay * 2, std::chrono::milliseconds(200));
  }
  if (const std::string why = CheckSibling(fd); !why.empty()) {
    ::close(fd);
    return HolderFails(
        me, kExitUnavailable,
        "will not register with @" + name.substr(1) + ": " + why);
  }
  std::string payload =
      std::string(kVersionField) + '\0' + std::to_string(me.world_rank) + '\0' +
      std::to_string(me.local_rank) + '\0' + Proof(key, job_id, me.world_rank);
  for (const auto& v : MpiVariables(::environ)) payload += '\0' + v;
  if (payload.size() > kMaxRegistrationBytes) {
    ::close(fd);
    return HolderFails(me, kExitUsage, "MPI variables too large to register");
  }
  const auto n = static_cast<uint32_t>(payload.size());
  const char header[4] = {static_cast<char>(n >> 24),
                          static_cast<char>(n >> 16), static_cast<char>(n >> 8),
                          static_cast<char>(n)};
  Status st = base::WriteAll(fd, std::string_view(header, 4));
  if (st.ok()) st = base::WriteAll(fd, payload);
  if (!st.ok()) {
    ::close(fd);
    return HolderFails(me, kExitUnavailable,
                       "cannot register: " + st.message());
  }
  std::string refusal;
  while (true) {
    char buf[512];
    const ssize_t got = ::read(fd, buf, sizeof(buf));
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) break;
    for (ssize_t i = 0; i < got; ++i) {
      if (!refusal.empty()) {
        if (refusal.size() < 4096) refusal.push_back(buf[i]);
      } else if (buf[i] == kReleased) {
        ::close(fd);
        return 0;
      } else if (buf[i] == kRefused) {
        refusal.push_back(buf[i]);
      }
    }
  }
  ::close(fd);
  if (!refusal.empty())
    return HolderFails(me, kExitUsage, "refused: " + refusal.substr(1));
  return HolderFails(me, kExitUnavailable,
                     "the agent of this node went away before the job ended");
}

}  // namespace dslaunch::agent
