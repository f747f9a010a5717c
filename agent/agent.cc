#include "agent/agent.h"

#include <fcntl.h>   // open
#include <signal.h>  // SIGTERM, SIGKILL
#include <spdlog/spdlog.h>
#include <unistd.h>  // dup

#include <boost/asio/post.hpp>
#include <cerrno>
#include <cstring>

#include "agent/node_facts.h"  // FindFreePort
#include "agent/worker_set.h"
#include "base/exit_status.h"
#include "base/unix_time.h"
#include "proto/auth.h"
#include "proto/progress.h"  // EscapeForLog
#include "proto/version.h"

namespace dslaunch::agent {

namespace asio = boost::asio;

static constexpr size_t kFlushBytes = 256 * 1024;

static const char* StateName(Agent::State s) {
  switch (s) {
    case Agent::State::kConnecting:
      return "Connecting";
    case Agent::State::kSpawning:
      return "Spawning";
    case Agent::State::kRunning:
      return "Running";
    case Agent::State::kDraining:
      return "Draining";
    case Agent::State::kIdle:
      return "Idle";
    case Agent::State::kExited:
      return "Exited";
  }
  return "?";
}

std::string Agent::FormatSeconds(double s) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%g", s);
  return buf;
}

static RankMonitorOptions MonitorOptions(const AgentOptions& options) {
  RankMonitorOptions o;
  o.stacks.argv = options.stack_helper;
  return o;
}

Agent::Agent(AgentOptions options, AgentParts parts)
    : options_(std::move(options)),
      link_(parts.link ? parts.link(io_) : MakeTcpLink(io_)),
      signals_(io_, SIGTERM, SIGINT, SIGHUP),
      stdin_(io_),
      connect_timer_(io_),
      retry_timer_(io_),
      heartbeat_timer_(io_),
      grace_timer_(io_),
      alive_timer_(io_),
      workers_(parts.ranks ? parts.ranks(io_, this)
                           : std::make_unique<WorkerSet>(io_, this)),
      progress_(io_, this),
      monitor_(
          io_, [this](const wire::Envelope& env) { Send(env); },
          MonitorOptions(options_)),
      store_(io_,
             [this](const wire::StoreRequest& r) {
               wire::Envelope env;
               *env.mutable_store_request() = r;
               return link_->Send(env);
             }),
      horovod_(io_, [this](wire::StoreRequest r, StoreProxy::Answer a) {
        store_.Submit(std::move(r), std::move(a));
      }) {
  link_->SetHandlers({
      .connected = [this] { OnConnected(); },
      .dial_failed =
          [this](bool resolving, const std::string& why) {
            DialFailed(resolving, why);
          },
      .message = [this](wire::Envelope&& m) { HandleMessage(std::move(m)); },
      .closed = [this](const Status& st) { OnClosed(st); },
      .drained = [this] { OnChannelDrained(); },
  });
}

Agent::~Agent() {
  RemoveReadyFile();
  if (alive_fd_ >= 0) {
    ::close(alive_fd_);
    ::unlink(options_.alive_file.c_str());
  }
  RemoveRunDir();
}

int Agent::Run() {
  ::signal(SIGPIPE, SIG_IGN);
  if (options_.mpi) {
    mpi_ = std::make_unique<MpiHolders>(
        io_, options_.job_id, std::move(options_.mpi_key), *options_.mpi);
    if (Status st = mpi_->Listen(); !st.ok()) {
      spdlog::error("{}", st.message());
      return kExitUnavailable;
    }
  }
  WatchSignals();
  if (options_.stdin_is_lifeline) WatchStdin();
  MakeAliveFile();
  Connect();
  io_.run();
  return exit_code_;
}

void Agent::SetState(State next) {
  spdlog::info("state {} -> {}", StateName(state_), StateName(next));
  state_ = next;
}

void Agent::WatchSignals() {
  signals_.async_wait([this](const boost::system::error_code& ec, int sig) {
    if (ec) return;
    spdlog::warn("received signal {}; stopping workers", sig);
    restart_expected_ = false;  // no further generation here
    if (state_ == State::kRunning || state_ == State::kIdle) {
      // Before the workers' exits: they die of our stop, not of their own.
      wire::Envelope env;
      env.mutable_agent_signalled()->set_signal(sig);
      Send(env);
    }
    if (state_ == State::kConnecting) {
      exit_code_ = ExitStatusForProcess(0, sig);
      SetState(State::kExited);
      io_.stop();
      return;
    }
    if (state_ == State::kIdle) return Finish();
    Drain(state_ == State::kDraining,
          "agent received signal " + std::to_string(sig));
    WatchSignals();
  });
}

void Agent::WatchStdin() {
  if (!stdin_.is_open()) stdin_.assign(::dup(0));
  stdin_.async_read_some(asio::buffer(&stdin_byte_, 1),
                         [this](const boost::system::error_code& ec, size_t) {
                           if (ec == asio::error::operation_aborted) return;
                           if (ec)
                             return OnLauncherLost("launcher's pipe closed");
                           WatchStdin();  // stray input is ignored
                         });
}

void Agent::HandleMessage(wire::Envelope&& msg) {
  last_heard_ = std::chrono::steady_clock::now();
  spdlog::debug("received {}", proto::MessageName(msg));
  const bool authed = state_ != State::kConnecting;
  switch (msg.msg_case()) {
    case wire::Envelope::kWelcome:
      if (auth_sent_) break;
      return HandleWelcome(msg.welcome());
    case wire::Envelope::kJobSpec:
      // The first, or the next generation's.
      if (!auth_sent_ || (authed && state_ != State::kIdle)) break;
      return HandleJobSpec(msg.job_spec());
    case wire::Envelope::kHeartbeat:
      // Authenticated nodes wait for their JobSpec until node 0 has joined
      // (its free port is MASTER_PORT); heartbeats come meanwhile. The
      // launcher sends the first at once: it accepted us, which is what a
      // joining agent's ready file says.
      if (!auth_sent_) break;
      if (options_.join && state_ == State::kConnecting && !accepted_) {
        accepted_ = true;
        MakeReadyFile();
      }
      return;
    // Abort and Shutdown may come instead of a JobSpec when the job ended
    // while this agent was still connecting.
    case wire::Envelope::kAbort:
      if (!auth_sent_) break;
      if (state_ == State::kConnecting && msg.abort().restart() &&
          !launcher_lost_) {
        // No JobSpec for this agent now: it stands by (a spare, a lost
        // node's new agent), idle, for a later generation.
        spdlog::info("standing by: {}",
                     proto::EscapeForLog(msg.abort().reason(), 1024));
        restart_expected_ = true;
        return Drain(false, "standing by");
      }
      if (options_.join) {
        // The pod fails with the job (or with its refusal).
        exit_code_ =
            msg.abort().exit_status() != 0 ? msg.abort().exit_status() : 1;
        if (state_ == State::kConnecting && !accepted_) {
          spdlog::error("{} (this agent's claim came from {})",
                        proto::EscapeForLog(msg.abort().reason(), 1024),
                        options_.join_rank_from);
        } else if (state_ == State::kConnecting) {
          spdlog::error("the job ended before it started: {}",
                        proto::EscapeForLog(msg.abort().reason(), 1024));
        }
      }
      restart_expected_ = msg.abort().restart() && !launcher_lost_;
      if (state_ == State::kIdle) {
        if (restart_expected_) return;  // already waiting for it
        return Finish();
      }
      return Drain(msg.abort().kill_now(), msg.abort().reason());
    case wire::Envelope::kShutdown:
      if (!auth_sent_) break;
      restart_expected_ = false;
      if (workers_->unfinished() == 0) return Finish();
      return Drain(false, "launcher asked to shut down");
    case wire::Envelope::kStoreResponse:
      if (!authed) break;
      return store_.HandleResponse(msg.store_response());
    case wire::Envelope::kCollectStacks:
      if (!authed) break;
      return monitor_.HandleCollectStacks(msg.collect_stacks());
    default:
      break;
  }
  link_->Close(ProtocolError("unexpected " + proto::MessageName(msg) +
                             " in state " + StateName(state_)));
}

void Agent::HandleWelcome(const wire::Welcome& welcome) {
  if (welcome.protocol_version() != kProtocolVersion) {
    return link_->Close(
        ProtocolError("launcher speaks protocol " +
                      std::to_string(welcome.protocol_version()) +
                      ", this agent " + std::to_string(kProtocolVersion)));
  }
  const std::string expected = proto::LauncherProof(
      options_.secret, client_nonce_, welcome.server_nonce());
  if (!proto::ConstantTimeEqual(expected, welcome.launcher_proof())) {
    return link_->Close(
        ProtocolError("launcher failed to prove the job secret"));
  }
  wire::Envelope env;
  env.mutable_auth()->set_agent_proof(proto::AgentProof(
      options_.secret, client_nonce_, welcome.server_nonce()));
  auth_sent_ = true;
  Send(env);
  // Joined: the job starts when every node has joined, which may take as
  // long as the launcher's --join_timeout; the heartbeats watch the link.
  if (options_.join) {
    connect_timer_armed_ = false;
    connect_timer_.cancel();
  }
  if (welcome.heartbeat_interval_s() > 0)
    heartbeat_interval_s_ = welcome.heartbeat_interval_s();
  if (welcome.heartbeat_timeout_s() > 0)
    heartbeat_timeout_s_ = welcome.heartbeat_timeout_s();
  StartHeartbeats();
}

void Agent::HandleJobSpec(const wire::JobSpec& job) {
  job_ = job;
  connect_timer_.cancel();
  const bool restarted = state_ == State::kIdle;
  restart_expected_ = false;
  exit_code_ = 0;
  SetState(State::kSpawning);
  if (restarted) {
    spdlog::info("generation {} of job {} as node rank {} of {}",
                 job_.restart_count(), job_.job_id(), job_.node_rank(),
                 job_.num_nodes());
    // A joined agent is the node rank the launcher gave it; another keeps
    // the index it was started with (its cgroup's name, which its starter
    // cleans up after it).
    if (options_.join) options_.node_rank = job_.node_rank();
  } else if (options_.join) {
    spdlog::info("joined job {} as node rank {} of {} (claimed: {})",
                 job_.job_id(), job_.node_rank(), job_.num_nodes(),
                 options_.join_rank_from);
    options_.node_rank = job_.node_rank();
    MakeReadyFile();
  }
  if (job_.heartbeat_interval_s() > 0)
    heartbeat_interval_s_ = job_.heartbeat_interval_s();
  if (job_.heartbeat_timeout_s() > 0)
    heartbeat_timeout_s_ = job_.heartbeat_timeout_s();
  StartHeartbeats();
  if (Status st = SetUpRunDir(); !st.ok()) return FailSpawn(st);
  if (!mpi_) return StartWorkers();
  mpi_->WhenReady(options_.connect_timeout_s, [this](Status st) {
    if (state_ != State::kSpawning) return;  // stopped meanwhile
    if (!st.ok()) return FailSpawn(st);
    StartWorkers();
  });
}

void Agent::StartHeartbeats() {
  last_heard_ = std::chrono::steady_clock::now();
  ArmHeartbeat();
}

void Agent::ArmHeartbeat() {
  const double interval = heartbeat_interval_s_;
  const double timeout = heartbeat_timeout_s_;
  heartbeat_timer_.expires_after(base::Millis(interval));
  heartbeat_timer_.async_wait(
      [this, timeout](const boost::system::error_code& ec) {
        if (ec || state_ == State::kExited || !link_->open()) return;
        if (std::chrono::steady_clock::now() - last_heard_ >
            base::Millis(timeout)) {
          return OnLauncherLost("no heartbeat from the launcher for " +
                                FormatSeconds(timeout) + " s");
        }
        wire::Envelope env;
        env.mutable_heartbeat()->set_seq(++heartbeat_seq_);
        Send(env);
        ArmHeartbeat();
      });
}

void Agent::OnLauncherLost(const std::string& why) {
  if (state_ == State::kExited || launcher_lost_) return;
  launcher_lost_ = true;
  spdlog::warn("launcher lost: {}", why);
  RemoveReadyFile();  // not in the job any more
  exit_code_ = kExitUnavailable;
  restart_expected_ = false;
  link_->Close(Unavailable(why));
  workers_->ResumeOutput();
  store_.ResumeReading();
  horovod_.ResumeAccepting();
  if (state_ == State::kConnecting) {
    SetState(State::kExited);
    io_.stop();
    return;
  }
  if (state_ == State::kIdle) return Finish();
  Drain(false, "launcher lost: " + why);
}

void Agent::Drain(bool kill_now, const std::string& why) {
  if (state_ == State::kExited) return;
  connect_timer_.cancel();
  if (state_ != State::kDraining) {
    spdlog::info("draining: {}", proto::EscapeForLog(why, 1024));
    SetState(State::kDraining);
    const double grace = job_.kill_grace_s() > 0 ? job_.kill_grace_s() : 5.0;
    grace_timer_.expires_after(base::Millis(grace));
    grace_timer_.async_wait([this](const boost::system::error_code& ec) {
      if (ec) return;
      workers_->SignalAll(SIGKILL);
      workers_->KillDescendants();  // setsid or orphaned, all of them
    });
  }
  workers_->SignalAll(kill_now ? SIGKILL : SIGTERM);
  if (workers_->unfinished() == 0) WorkersGone();
}

void Agent::WorkersGone() {
  if (restart_expected_) return EndGeneration();
  Finish();
}

// The node is ready for the next generation as it was for the first: no
// process, socket or file of this one is left, and every store request it
// made went out before GenerationEnded (the launcher empties the store
// between generations).
void Agent::EndGeneration() {
  workers_->EndGeneration();
  Flush();  // the last output and progress, in Draining
  grace_timer_.cancel();
  progress_.Close();
  store_.Close();
  horovod_.Close();
  RemoveRunDir();
  spawned_.clear();
  SetState(State::kIdle);
  wire::Envelope env;
  auto* ended = env.mutable_generation_ended();
  ended->set_restart_count(job_.restart_count());
  // A fresh MASTER_PORT each generation: the last one's may linger. Every
  // node says one: which becomes node 0 is the launcher's choice.
  ended->set_free_port(FindFreePort());
  Send(env);
}

void Agent::Finish() {
  if (state_ == State::kExited) return;
  workers_->KillDescendants();  // nothing of the job outlives it
  monitor_.Stop();
  if (mpi_) mpi_->Release();  // mpirun's processes of this node end now
  Flush();
  SetState(State::kExited);
  grace_timer_.cancel();
  heartbeat_timer_.cancel();
  connect_timer_.cancel();
  alive_timer_.cancel();
  signals_.cancel();
  boost::system::error_code ignored;
  stdin_.close(ignored);
  progress_.Close();
  store_.Close();
  horovod_.Close();
  if (link_->open()) {
    wire::Envelope env;
    env.mutable_agent_done();
    Send(env);
    link_->CloseAfterFlush();  // OnClosed stops the loop
    // A launcher that stopped reading must not keep this agent alive.
    grace_timer_.expires_after(std::chrono::seconds(5));
    grace_timer_.async_wait([this](const boost::system::error_code& ec) {
      if (!ec) io_.stop();
    });
  } else {
    io_.stop();
  }
}

void Agent::Send(const wire::Envelope& msg) {
  if (!link_->open()) return;
  Status st = link_->Send(msg);
  if (!st.ok())
    spdlog::warn("send {}: {}", proto::MessageName(msg), st.message());
}

void Agent::OnWorkerOutput(int rank, bool is_stderr, std::string line,
                           bool partial) {
  pending_log_bytes_ += line.size() + 16;
  auto* e = pending_logs_.mutable_log_batch()->add_entries();
  e->set_rank(rank);
  e->set_stream(is_stderr ? wire::LogBatch::STDERR : wire::LogBatch::STDOUT);
  e->set_line(std::move(line));
  e->set_partial(partial);
  if (pending_log_bytes_ >= kFlushBytes)
    Flush();
  else
    ScheduleFlush();
}

void Agent::OnProgressRecord(int rank, std::string json, double time) {
  pending_progress_.Add(rank, std::move(json), time);
  ScheduleFlush();
}

void Agent::OnMalformedProgress(int rank, const Status& why) {
  spdlog::debug("rank {}: dropped progress record: {}", rank, why.message());
  pending_progress_.CountMalformed(rank);
  ScheduleFlush();
}

void Agent::ScheduleFlush() {
  if (flush_scheduled_) return;
  flush_scheduled_ = true;
  asio::post(io_, [this] { Flush(); });
}

bool Agent::Congested() const {
  // Backpressure only toward a live launcher: without one, output is read
  // (and dropped) so that workers can finish.
  return link_->open() && link_->congested();
}

void Agent::Flush() {
  flush_scheduled_ = false;
  if (pending_logs_.has_log_batch()) Send(pending_logs_);
  pending_logs_.Clear();
  pending_log_bytes_ = 0;
  // Progress waits while the channel is congested, except at the end (its
  // queue is bounded, so the last records and the counts always go out).
  if (!Congested() || state_ == State::kDraining) {
    for (const auto& batch : pending_progress_.Take()) Send(batch);
  }
  if (Congested()) {
    workers_->PauseOutput();
    store_.PauseReading();
    horovod_.PauseAccepting();
  }
}

void Agent::OnChannelDrained() {
  workers_->ResumeOutput();
  store_.ResumeReading();
  horovod_.ResumeAccepting();
  if (!pending_progress_.empty()) ScheduleFlush();
}

void Agent::OnWorkerExited(int rank, pid_t pid, const ExitInfo& info) {
  Flush();  // its last lines go before its exit
  spdlog::info("rank {} (pid {}) exited: code {} signal {}", rank, pid,
               info.exit_code, info.signal);
  wire::Envelope env;
  auto* exited = env.mutable_worker_exited();
  exited->set_rank(rank);
  exited->set_pid(pid);
  exited->set_exit_code(info.exit_code);
  exited->set_signal(info.signal);
  exited->set_error(info.error);
  exited->set_time(base::UnixSeconds());
  exited->set_stopped(info.signalled);
  monitor_.OnExited(rank, info, exited);  // OOM verdict, error file
  Send(env);
  if (state_ == State::kDraining && workers_->unfinished() == 0) WorkersGone();
}

}  // namespace dslaunch::agent
