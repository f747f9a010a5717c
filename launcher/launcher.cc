#include "launcher/launcher.h"

#include <limits.h>  // PATH_MAX
#include <signal.h>
#include <spdlog/spdlog.h>
#include <unistd.h>  // getcwd, readlink

#include <boost/asio/post.hpp>
#include <cstdio>

#include "launcher/addresses.h"
#include "launcher/report.h"
#include "proto/auth.h"

namespace dslaunch::launcher {

namespace asio = boost::asio;

static const char* StateName(Launcher::State s) {
  switch (s) {
    case Launcher::State::kStarting:
      return "Starting";
    case Launcher::State::kRunning:
      return "Running";
    case Launcher::State::kStopping:
      return "Stopping";
    case Launcher::State::kDone:
      return "Done";
  }
  return "?";
}

static std::chrono::milliseconds Ms(double seconds) {
  return std::chrono::milliseconds(static_cast<int64_t>(seconds * 1000));
}

static ControlServer::Options ServerOptions(
    const LaunchOptions& o, const std::string& secret,
    const std::string& job_id, int num_nodes,
    std::function<std::optional<std::string>(int)> node_secret) {
  ControlServer::Options s;
  s.node_secret = std::move(node_secret);
  s.secret = secret;
  s.job_id = job_id;
  s.num_nodes = num_nodes;
  s.heartbeat_interval_s = o.heartbeat_interval_s;
  s.heartbeat_timeout_s = o.heartbeat_timeout_s;
  return s;
}

Launcher::Launcher(LaunchOptions options, Plan plan, EnvList job_env)
    : options_(std::move(options)),
      plan_(std::move(plan)),
      job_env_(std::move(job_env)),
      job_id_(proto::HexEncode(proto::RandomBytes(8))),
      secret_(proto::HexEncode(proto::RandomBytes(proto::kSecretBytes))),
      console_(stdout, stderr),
      server_(io_,
              ServerOptions(options_, secret_, job_id_,
                            static_cast<int>(plan_.nodes.size()),
                            [this](int node) { return NodeSecret(node); }),
              this),
      store_(io_),
      signals_(io_, SIGINT, SIGTERM, SIGHUP),
      start_timer_(io_),
      stop_timer_(io_) {
  nodes_.resize(plan_.nodes.size());
  for (const auto& node : plan_.nodes) {
    for (size_t i = 0; i < node.slots.size(); ++i) {
      ranks_[node.first_rank + static_cast<int>(i)].node_rank = node.node_rank;
    }
  }
}

Launcher::~Launcher() = default;

std::optional<std::string> Launcher::NodeSecret(int node_rank) const {
  if (options_.launcher != "pdsh") return secret_;
  auto it = node_secrets_.find(node_rank);
  if (it == node_secrets_.end()) return std::nullopt;
  return it->second;
}

void Launcher::OnAgentSecret(int node_rank, std::string secret) {
  if (node_secrets_.count(node_rank)) {
    // A second secret for one node: something else printed it. Refuse both.
    node_secrets_[node_rank] = "";
    return OnNodeGone(node_rank, "two agents claimed the node");
  }
  node_secrets_[node_rank] = std::move(secret);
}

void Launcher::SetState(State next) {
  spdlog::info("state {} -> {}", StateName(state_), StateName(next));
  state_ = next;
}

int Launcher::Run() {
  ::signal(SIGPIPE, SIG_IGN);
  start_time_ = std::chrono::steady_clock::now();
  Status st = console_.Open(plan_, options_.log_dir);
  if (!st.ok()) {
    console_.Note(st.message());
    return 64;
  }
  std::vector<std::string> hosts;
  for (const auto& node : plan_.nodes) hosts.push_back(node.host);
  StatusOr<int> port = server_.Listen(
      ChooseControlAddresses(hosts, options_.bind_addr, options_.control_addr,
                             AddressLookup::System()),
      0);
  if (port.ok()) {
    spdlog::info("job {}: control server on port {}", job_id_, *port);
    st = StartAgents(*port);  // launcher_start.cc
  } else
    st = port.status();
  if (!st.ok()) {
    console_.Note(st.message());
    return st.code() == StatusCode::kInvalidArgument ? 64
           : st.code() == StatusCode::kInternal      ? 70
                                                     : 69;
  }
  WatchSignals();
  start_timer_.expires_after(Ms(options_.start_timeout_s));
  start_timer_.async_wait([this](const boost::system::error_code& ec) {
    if (ec || state_ != State::kStarting) return;
    for (size_t n = 0; n < nodes_.size(); ++n) {
      if (!nodes_[n].authenticated) {
        OnNodeGone(
            static_cast<int>(n),
            "its agent did not connect within " +
                std::to_string(static_cast<int>(options_.start_timeout_s)) +
                " s");
      }
    }
  });
  io_.run();
  console_.Flush();
  PrintReport();
  console_.Flush();
  console_.DrainTerminal();
  return ExitCode();
}

wire::JobSpec Launcher::MakeJobSpec(int node_rank) const {
  const NodePlan& node = Node(node_rank);
  wire::JobSpec job;
  job.set_job_id(job_id_);
  for (const auto& a : options_.program) job.add_argv(a);
  for (const auto& [key, value] : job_env_) {
    auto* var = job.add_env();
    var->set_key(key);
    var->set_value(value);
  }
  char cwd[PATH_MAX] = {0};
  if (::getcwd(cwd, sizeof(cwd))) job.set_cwd(cwd);
  for (size_t i = 0; i < node.slots.size(); ++i) {
    auto* r = job.add_ranks();
    r->set_rank(node.first_rank + static_cast<int>(i));
    r->set_local_rank(static_cast<int>(i));
    r->set_slot(node.slots[i]);
    job.add_visible_slots(node.slots[i]);
  }
  job.set_node_rank(node_rank);
  job.set_num_nodes(static_cast<int>(plan_.nodes.size()));
  job.set_world_size(plan_.world_size);
  job.set_master_addr(plan_.master_addr);
  job.set_master_port(plan_.master_port);
  job.set_kill_grace_s(options_.kill_grace_s);
  job.set_heartbeat_interval_s(options_.heartbeat_interval_s);
  job.set_heartbeat_timeout_s(options_.heartbeat_timeout_s);
  job.set_append_local_rank(!options_.no_local_rank);
  job.set_host(node.host);
  return job;
}

void Launcher::OnAgentAuthenticated(int node_rank, const wire::Hello& hello,
                                    const std::string&) {
  spdlog::info("node {} ({}) joined: agent pid {}, {} cores, {} GPUs",
               node_rank, hello.facts().hostname(), hello.facts().agent_pid(),
               hello.facts().cpu_cores(), hello.facts().gpus_size());
  nodes_[node_rank].authenticated = true;
  wire::Envelope env;
  if (state_ == State::kStopping) {
    env.mutable_shutdown();  // too late: the job is already ending
  } else {
    *env.mutable_job_spec() = MakeJobSpec(node_rank);
  }
  (void)server_.Send(node_rank, env);
}

void Launcher::OnAgentMessage(int node_rank, wire::Envelope&& msg) {
  switch (msg.msg_case()) {
    case wire::Envelope::kLogBatch:
      for (const auto& e : msg.log_batch().entries()) {
        console_.Line(e.rank(), e.stream() == wire::LogBatch::STDERR, e.line(),
                      e.partial());
      }
      return console_.Flush();
    case wire::Envelope::kProgressBatch:
      for (const auto& r : msg.progress_batch().records()) {
        console_.Progress(r.rank(), r.json(), r.time());
      }
      for (const auto& [rank, count] : msg.progress_batch().malformed()) {
        malformed_progress_[rank] += count;
      }
      for (const auto& [rank, count] : msg.progress_batch().dropped()) {
        dropped_progress_[rank] += count;
      }
      return;
    case wire::Envelope::kWorkerStarted: {
      auto it = ranks_.find(msg.worker_started().rank());
      if (it == ranks_.end() || it->second.node_rank != node_rank ||
          it->second.started) {
        spdlog::warn("node {}: start of unknown rank {}", node_rank,
                     msg.worker_started().rank());
        return;
      }
      auto& r = it->second;
      r.pid = msg.worker_started().pid();
      r.started = true;
      ++started_ranks_;
      if (state_ == State::kStarting && started_ranks_ == ranks_.size()) {
        SetState(State::kRunning);
      }
      return;
    }
    case wire::Envelope::kWorkerExited:
      return HandleWorkerExited(node_rank, msg.worker_exited());
    case wire::Envelope::kStoreRequest:
      return HandleStore(node_rank, msg.store_request());
    case wire::Envelope::kAgentDone:
      spdlog::info("node {} done", node_rank);
      return;
    default:
      spdlog::warn("node {}: unexpected {}", node_rank,
                   proto::MessageName(msg));
  }
}

void Launcher::HandleStore(int node_rank, const wire::StoreRequest& request) {
  store_.Handle(request,
                [this, node_rank](const wire::StoreResponse& response) {
                  wire::Envelope env;
                  *env.mutable_store_response() = response;
                  (void)server_.Send(node_rank, env);
                });
}

void Launcher::HandleWorkerExited(int node_rank, const wire::WorkerExited& e) {
  auto it = ranks_.find(e.rank());
  if (it == ranks_.end() || it->second.node_rank != node_rank ||
      it->second.exited) {
    spdlog::warn("node {}: exit of unknown rank {}", node_rank, e.rank());
    return;
  }
  RankState& r = it->second;
  r.exited = true;
  r.pid = e.pid();
  r.exit_code = e.exit_code();
  r.signal = e.signal();
  r.error = e.error();
  r.exit_time = e.time();
  r.exited_at = std::chrono::steady_clock::now();
  ++exited_ranks_;
  if (!r.error.empty())
    console_.Note("rank " + std::to_string(e.rank()) + ": " + r.error);
  const bool failed = r.signal != 0 || r.exit_code != 0;
  if (failed && state_ != State::kStopping && !first_failed_rank_) {
    first_failed_rank_ = e.rank();
    Stop("rank " + std::to_string(e.rank()) + " on " + Node(node_rank).host +
             " " + DescribeExit(r.exit_code, r.signal),
         false);
  } else if (failed && first_failed_rank_ &&
             r.exit_time < ranks_.at(*first_failed_rank_).exit_time) {
    // Reports race: a peer that failed because this rank died (a broken
    // connection) may be heard of first. The earliest failure is the cause.
    first_failed_rank_ = e.rank();
  } else if (exited_ranks_ == ranks_.size() && state_ != State::kStopping) {
    BeginStopping("every rank finished");
    wire::Envelope env;
    env.mutable_shutdown();
    for (size_t n = 0; n < nodes_.size(); ++n) {
      (void)server_.Send(static_cast<int>(n), env);
    }
  }
  MaybeDone();
}

void Launcher::OnAgentDisconnected(int node_rank, const Status& why) {
  NodeState& node = nodes_[node_rank];
  node.disconnected = true;
  bool ranks_left = false;
  for (const auto& [rank, r] : ranks_) {
    if (r.node_rank == node_rank && !r.exited) ranks_left = true;
  }
  if (ranks_left) {
    OnNodeGone(node_rank,
               "its agent's connection ended (" +
                   (why.ok() ? std::string("closed") : why.message()) + ")");
  }
  MaybeDone();
}

void Launcher::OnAgentProcessExited(int node_rank, const std::string& how) {
  NodeState& node = nodes_[node_rank];
  node.process_exited = true;
  // A connected agent's end shows on its connection, which also carries its
  // last messages; one that never connected is lost here.
  if (!node.authenticated)
    OnNodeGone(node_rank, "its agent " + how + " before connecting");
  MaybeDone();
}

void Launcher::OnNodeGone(int node_rank, const std::string& why) {
  NodeState& node = nodes_[node_rank];
  if (!node.lost_reason.empty()) return;
  node.lost_reason = why;
  if (state_ == State::kStopping) return;
  spdlog::warn("node {} ({}) lost: {}", node_rank, Node(node_rank).host, why);
  lost_node_ = node_rank;
  Stop("node " + std::to_string(node_rank) + " (" + Node(node_rank).host +
           ") was lost",
       false);
}

void Launcher::BeginStopping(const std::string& reason) {
  if (state_ == State::kStopping || state_ == State::kDone) return;
  stop_reason_ = reason;
  stop_time_ = std::chrono::steady_clock::now();
  SetState(State::kStopping);
  start_timer_.cancel();
  // Agents SIGKILL their workers after the grace period; one that still has
  // not finished well after that is killed itself.
  stop_timer_.expires_after(Ms(options_.kill_grace_s + 5));
  stop_timer_.async_wait([this](const boost::system::error_code& ec) {
    if (ec) return;
    for (size_t n = 0; n < nodes_.size(); ++n) {
      if (!NodeFinished(static_cast<int>(n))) {
        console_.Note("agent of node " + std::to_string(n) + " (" +
                      Node(static_cast<int>(n)).host +
                      ") did not stop in time; killing it");
        starter_->Kill(static_cast<int>(n));
      }
    }
    stop_timer_.expires_after(std::chrono::seconds(3));
    stop_timer_.async_wait([this](const boost::system::error_code& ec) {
      if (!ec) io_.stop();
    });
  });
}

void Launcher::Stop(const std::string& reason, bool kill_now) {
  BeginStopping(reason);
  wire::Envelope env;
  env.mutable_abort()->set_reason(reason);
  env.mutable_abort()->set_kill_now(kill_now);
  for (size_t n = 0; n < nodes_.size(); ++n) {
    const int node = static_cast<int>(n);
    if (nodes_[n].authenticated) {
      (void)server_.Send(node, env);
    } else if (starter_ && !nodes_[n].process_exited) {
      starter_->Kill(node);  // no workers yet: nothing to stop gracefully
    }
  }
  MaybeDone();
}

bool Launcher::NodeFinished(int node_rank) const {
  const NodeState& node = nodes_[node_rank];
  return node.process_exited && (node.disconnected || !node.authenticated);
}

void Launcher::MaybeDone() {
  if (state_ != State::kStopping) return;
  for (size_t n = 0; n < nodes_.size(); ++n) {
    if (!NodeFinished(static_cast<int>(n))) return;
  }
  done_time_ = std::chrono::steady_clock::now();
  SetState(State::kDone);
  store_.FailAll("job ended");
  server_.Shutdown();
  io_.stop();
}

void Launcher::WatchSignals() {
  signals_.async_wait([this](const boost::system::error_code& ec, int sig) {
    if (ec) return;
    ++interrupts_;
    if (interrupts_ == 1 && state_ != State::kStopping) {
      interrupted_ = true;
      interrupt_signal_ = sig;
      console_.Note("interrupted (" + SignalName(sig) +
                    "); stopping every rank (again to kill at once)");
      Stop("interrupted by the user", false);
    } else {
      console_.Note("killing every rank now");
      if (!interrupted_ && !first_failed_rank_ && !lost_node_) {
        interrupted_ = true;
        interrupt_signal_ = sig;
      }
      Stop("interrupted by the user again", true);
    }
    WatchSignals();
  });
}

int Launcher::ExitCode() const {
  if (preflight_failed_) return 69;
  if (first_failed_rank_) {
    const RankState& r = ranks_.at(*first_failed_rank_);
    return ExitStatusFor(r.exit_code, r.signal);
  }
  if (lost_node_) return 69;
  if (interrupted_) return 130;
  for (const auto& [rank, r] : ranks_) {
    if (!r.exited) return 70;  // should not happen: the job ended unaccounted
  }
  return 0;
}

}  // namespace dslaunch::launcher
