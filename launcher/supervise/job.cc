#include "launcher/supervise/job.h"

#include <limits.h>  // PATH_MAX
#include <signal.h>
#include <spdlog/spdlog.h>
#include <unistd.h>  // getcwd

#include <algorithm>  // max

#include "launcher/plan/addresses.h"
#include "launcher/report/report.h"
#include "proto/progress.h"   // EscapeControlChars
#include "proto/unix_time.h"

namespace dslaunch::launcher {

namespace asio = boost::asio;

static std::chrono::milliseconds Ms(double seconds) {
  return std::chrono::milliseconds(static_cast<int64_t>(seconds * 1000));
}

static std::string WorkingDirectory() {
  char cwd[PATH_MAX] = {0};
  return ::getcwd(cwd, sizeof(cwd)) ? cwd : "";
}

Job::Job(asio::io_context& io, const LaunchOptions& options, Plan plan,
         EnvList job_env, RankCommand command, Console& console,
         std::string job_id, std::string secret)
    : io_(io),
      options_(options),
      plan_(std::move(plan)),
      job_env_(std::move(job_env)),
      command_(std::move(command)),
      console_(console),
      job_id_(std::move(job_id)),
      secret_(std::move(secret)),
      cwd_(WorkingDirectory()),
      state_(plan_),
      store_(io),
      start_timer_(io),
      stop_timer_(io),
      join_wait_timer_(io),
      mode_(StartModeNamed(options.launcher)),
      join_(mode_.agents_join),
      master_port_known_(options.master_port_given),
      watch_(io, options, console,
             {[this](const std::vector<int>& ranks, const std::string& why) {
                CollectStacks(ranks, why);
              },
              [this](int rank, const std::string& why) {
                AbortForHang(rank, why);
              }}),
      hang_abort_timer_(io) {}

Job::~Job() = default;

std::optional<std::string> Job::NodeSecret(int node_rank) const {
  if (starter_ == nullptr) return std::nullopt;  // nothing started yet
  if (!starter_->AgentsMakeSecrets()) return secret_;
  auto it = node_secrets_.find(node_rank);
  if (it == node_secrets_.end()) return std::nullopt;
  return it->second;
}

void Job::Start(Starter* starter, AgentLinks* links, int control_port) {
  starter_ = starter;
  links_ = links;
  start_time_ = Clock::now();
  control_port_ = control_port;
  ArmStartTimer();
  watch_.Start();
  if (join_) ArmJoinWaitTimer();
  AgentBootstrap boot{&plan_, &options_, job_id_, secret_, control_port};
  starter_->Start(boot, [this](StatusOr<Starter::Started> started) {
    OnStarted(std::move(started));
  });
}

void Job::OnStarted(StatusOr<Starter::Started> started) {
  if (!started.ok()) {
    console_.Note(started.status().message());
    if (state_.phase() == Phase::kStarting) {
      state_.StartFailed(started.status());
      return io_.stop();
    }
    // Already stopping (interrupted meanwhile): what was not started never
    // will be, and no process of it will report its end.
    for (size_t n = 0; n < state_.nodes().size(); ++n) {
      const NodeRecord& node = state_.node(static_cast<int>(n));
      if (!node.authenticated && !node.process_exited)
        Act(state_.AgentProcessExited(static_cast<int>(n),
                                      "was never started"));
    }
    return MaybeEnd();
  }
  if (state_.phase() != Phase::kStarting) return;  // interrupted meanwhile
  if (options_.plan.master_addr.empty() && !started->master_addr.empty())
    plan_.master_addr = started->master_addr;
  spdlog::info("agents started on {} nodes", plan_.nodes.size());
}

void Job::ArmStartTimer() {
  start_timer_.expires_after(Ms(options_.start_timeout_s));
  start_timer_.async_wait([this](const boost::system::error_code& ec) {
    if (ec || state_.phase() != Phase::kStarting) return;
    const std::string why =
        (join_ ? "no agent joined as this node within "
               : "its agent did not connect within ") +
        std::to_string(static_cast<int>(options_.start_timeout_s)) + " s";
    if (join_) {
      console_.Note(
          "--join_timeout: no agent joined as node rank" +
          std::string(joined_.size() + 1 < plan_.nodes.size() ? "s " : " ") +
          MissingNodes() + " within " +
          std::to_string(static_cast<int>(options_.start_timeout_s)) + " s");
    }
    for (size_t n = 0; n < state_.nodes().size(); ++n) {
      if (!state_.node(static_cast<int>(n)).authenticated)
        Act(state_.NodeLost(static_cast<int>(n), why));
    }
  });
}

void Job::OnAgentSecret(int node_rank, std::string secret) {
  if (node_rank >= 0 && node_rank < static_cast<int>(state_.nodes().size()) &&
      state_.node(node_rank).authenticated) {
    // Its agent is in and its secret spent: a later line was written by
    // something else (a rank can open the tool's output through /proc). It
    // proves nothing now; it must not end the job in the agent's name.
    console_.Note("ignored a secret line for node " +
                  std::to_string(node_rank) +
                  " after its agent authenticated (not written by the agent)");
    return;
  }
  if (node_secrets_.count(node_rank)) {
    // A second secret for one node: something else printed it. Refuse both.
    node_secrets_[node_rank] = "";
    return Act(state_.NodeLost(node_rank, "two agents claimed the node"));
  }
  node_secrets_[node_rank] = std::move(secret);
}

void Job::OnStarterOutput(const std::string& source, std::string line) {
  console_.Relay("[" + source + " agent] " + proto::EscapeControlChars(line));
}

void Job::OnAgentAuthenticated(int node_rank, const wire::Hello& hello,
                               const std::string& agent_addr) {
  // A secret its agent made is good for this one connection: spent now.
  if (auto it = node_secrets_.find(node_rank); it != node_secrets_.end())
    it->second.clear();
  spdlog::info("node {} ({}) joined: agent pid {}, {} cores, {} GPUs",
               node_rank, proto::EscapeForLog(hello.facts().hostname(), 255),
               hello.facts().agent_pid(),
               hello.facts().cpu_cores(), hello.facts().gpus_size());
  if (Status st = state_.NodeAuthenticated(node_rank); !st.ok()) {
    spdlog::warn("{}", st.message());
    return;
  }
  if (state_.phase() != Phase::kStarting && state_.phase() != Phase::kRunning) {
    wire::Envelope env;
    if (join_) {
      // A pod that joins a job already ending did not succeed: its Abort
      // says so, and its exit status.
      env.mutable_abort()->set_reason(
          "the job ended before this agent joined (" + state_.outcome().reason +
          ")");
      env.mutable_abort()->set_kill_now(true);
      env.mutable_abort()->set_exit_status(state_.ExitStatus());
    } else {
      env.mutable_shutdown();  // too late: the job is already ending
    }
    (void)links_->Send(node_rank, env);
    return;
  }
  if (join_) return OnNodeJoined(node_rank, hello, agent_addr);
  if (node_rank == 0 && !options_.plan.master_addr.empty()) {
    const std::string warning =
        MasterAddrWarning(options_.plan.master_addr, plan_.nodes[0].host,
                          agent_addr, AddressLookup::System());
    if (!warning.empty()) console_.Note(warning);
  }
  if (node_rank == 0 && !master_port_known_) {
    master_port_known_ = true;
    int port = hello.facts().free_port();
    if (port > 65535) port = 0;  // not a port: the default
    if (port > 0) plan_.master_port = port;
    console_.Note("MASTER_PORT " + std::to_string(plan_.master_port) + ": " +
                  (port > 0
                       ? "a free port on node 0 (" + plan_.nodes[0].host + ")"
                       : "node 0 (" + plan_.nodes[0].host +
                             ") reported no free port; the default") +
                  "; --master_port chooses another");
  }
  held_specs_.push_back(node_rank);
  if (!master_port_known_ || !EveryAgentIn()) return;
  for (int n : held_specs_) SendJobSpec(n);
  held_specs_.clear();
}

// Where agents make their own secrets, a secret may be in the start tool's
// pipe to us until its node authenticated, and a rank of the same user
// could open that pipe through /proc: no rank runs before every node's did.
bool Job::EveryAgentIn() const {
  if (starter_ == nullptr || !starter_->AgentsMakeSecrets()) return true;
  for (size_t n = 0; n < state_.nodes().size(); ++n) {
    if (!state_.node(static_cast<int>(n)).authenticated) return false;
  }
  return true;
}

void Job::SendJobSpec(int node_rank) {
  wire::Envelope env;
  *env.mutable_job_spec() = MakeJobSpec(node_rank);
  (void)links_->Send(node_rank, env);
}

wire::JobSpec Job::MakeJobSpec(int node_rank) const {
  const NodePlan& node = plan_.nodes[node_rank];
  wire::JobSpec job;
  job.set_job_id(job_id_);
  for (const auto& a : command_.argv) job.add_argv(a);
  for (const auto& [key, value] : job_env_) {
    auto* var = job.add_env();
    var->set_key(key);
    var->set_value(value);
  }
  job.set_cwd(cwd_);
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
  job.set_append_local_rank(command_.local_rank_at >= 0);
  job.set_local_rank_at(std::max(command_.local_rank_at, 0));
  job.set_bind_cores_to_rank(options_.bind_cores_to_rank);
  // Ranks inside an allocation see srun's per-task variables also when
  // mpirun started them (its daemons are SLURM tasks, one per node).
  job.set_slurm_task_env(mode_.RanksAreSlurmTasks(options_.hosts_from_slurm));
  for (int core : options_.bind_cores) job.add_bind_core_list(core);
  job.set_host(node.host);
  return job;
}

void Job::OnAgentMessage(int node_rank, wire::Envelope&& msg) {
  switch (msg.msg_case()) {
    case wire::Envelope::kLogBatch:
      for (const auto& e : msg.log_batch().entries()) {
        if (!RankOfNode(e.rank(), node_rank)) continue;
        console_.Line(e.rank(), e.stream() == wire::LogBatch::STDERR, e.line(),
                      e.partial());
      }
      return console_.Flush();
    case wire::Envelope::kProgressBatch:
      return HandleProgress(node_rank, msg.progress_batch());
    case wire::Envelope::kWorkerStarted:
      return HandleWorkerStarted(node_rank, msg.worker_started());
    case wire::Envelope::kWorkerExited:
      return HandleWorkerExited(node_rank, msg.worker_exited());
    case wire::Envelope::kAgentSignalled:
      return HandleAgentSignalled(node_rank, msg.agent_signalled().signal());
    case wire::Envelope::kStoreRequest:
      return HandleStore(node_rank, msg.store_request());
    case wire::Envelope::kRankStats:
      for (const auto& e : msg.rank_stats().entries()) {
        if (RankOfNode(e.rank(), node_rank))
          console_.board().Stats(e.rank(), e.rss_bytes());
      }
      return;
    case wire::Envelope::kStacks:
      return HandleStacks(node_rank, msg.stacks());
    case wire::Envelope::kAgentDone:
      spdlog::info("node {} done", node_rank);
      done_nodes_.insert(node_rank);
      return;
    default:
      spdlog::warn("node {}: unexpected {}", node_rank,
                   proto::MessageName(msg));
  }
}

bool Job::RankOfNode(int rank, int node_rank) const {
  auto it = state_.ranks().find(rank);
  if (it != state_.ranks().end() && it->second.node_rank == node_rank)
    return true;
  spdlog::warn("node {}: output or progress of rank {}, not one of its own",
               node_rank, rank);
  return false;
}

void Job::HandleProgress(int node_rank, const wire::ProgressBatch& batch) {
  for (const auto& r : batch.records()) {
    if (RankOfNode(r.rank(), node_rank))
      console_.Progress(r.rank(), r.json(), r.time());
  }
  for (const auto& [rank, count] : batch.malformed()) {
    if (RankOfNode(rank, node_rank)) malformed_progress_[rank] += count;
  }
  for (const auto& [rank, count] : batch.dropped()) {
    if (RankOfNode(rank, node_rank)) dropped_progress_[rank] += count;
  }
}

void Job::HandleWorkerStarted(int node_rank, const wire::WorkerStarted& s) {
  auto action = state_.RankStarted(node_rank, s.rank(), s.pid());
  if (!action.ok())
    return spdlog::warn("node {}: {}", node_rank, action.status().message());
  // Stamped with this host's clock, as records are.
  console_.board().Started(s.rank(), s.pid(), proto::SteadySeconds());
  Act(*action);
}

void Job::HandleWorkerExited(int node_rank, const wire::WorkerExited& e) {
  auto action = state_.RankExited(node_rank, e.rank(), e.exit_code(),
                                  e.signal(), e.time(), e.error(), e.stopped());
  if (!action.ok())
    return spdlog::warn("node {}: {}", node_rank, action.status().message());
  console_.board().Exited(e.rank(), e.exit_code(), e.signal(), e.oom_killed());
  KeepExitForensics(e);
  console_.EndOfOutput(e.rank());
  if (!e.error().empty())
    console_.Note("rank " + std::to_string(e.rank()) + ": " + e.error());
  Act(*action);
  MaybeEnd();
}

void Job::HandleStore(int node_rank, const wire::StoreRequest& request) {
  store_.Handle(request,
                [this, node_rank](const wire::StoreResponse& response) {
                  wire::Envelope env;
                  *env.mutable_store_response() = response;
                  (void)links_->Send(node_rank, env);
                });
}

void Job::OnAgentDisconnected(int node_rank, const Status& why) {
  if (join_ && OnJoinedNodeLeft(node_rank, why)) return;
  Act(state_.NodeDisconnected(
      node_rank, why.ok() ? std::string("closed") : why.message()));
  // Where the start tool's daemons own the agent process (mpirun), an agent
  // that said it is done and closed has ended as far as we can tell.
  // A joined agent is not ours to wait for: its connection is all of it.
  if (starter_ && !starter_->SeesAgentProcesses() &&
      (join_ || done_nodes_.count(node_rank)))
    Act(state_.AgentProcessExited(node_rank, "ended"));
  MaybeEnd();
}

void Job::OnAgentProcessExited(int node_rank, const std::string& how) {
  Act(state_.AgentProcessExited(node_rank, how));
  MaybeEnd();
}

void Job::OnSignal(int sig) {
  const JobState::Action action = state_.Interrupted(sig);
  if (action == JobState::Action::kAbortAll) {
    console_.Note("interrupted (" + SignalName(sig) +
                  "); stopping every rank (again to kill at once)");
  } else if (action == JobState::Action::kKillAll) {
    console_.Note("killing every rank now");
  }
  Act(action);
}

void Job::OnStoppedByScheduler(const std::string& why) {
  StoppedFromOutside(SIGTERM, why);
}

void Job::StoppedFromOutside(int sig, const std::string& why) {
  const JobState::Action action = state_.StoppedFromOutside(sig, why);
  if (action == JobState::Action::kAbortAll)
    console_.Note(why + "; stopping every rank");
  Act(action);
}

// An agent signalled by someone else stops its ranks: they die of that, not
// of a failure of their own. Under SLURM it is SLURM ending the step.
void Job::HandleAgentSignalled(int node_rank, int sig) {
  const std::string& host = plan_.nodes[node_rank].host;
  StoppedFromOutside(sig, mode_.scheduler_signals_agents
                              ? "SLURM stopped the step (" + SignalName(sig) +
                                    " to the agent on " + host + ")"
                              : "the agent on " + host + " received " +
                                    SignalName(sig) + " from outside dslaunch");
}

void Job::Act(JobState::Action action) {
  switch (action) {
    case JobState::Action::kNone:
      return;
    case JobState::Action::kAbortAll:
      return Abort(false);
    case JobState::Action::kKillAll:
      return Abort(true);
    case JobState::Action::kShutdownAll:
      return ShutdownAll();
  }
}

void Job::SendToAll(const wire::Envelope& msg) {
  for (size_t n = 0; n < state_.nodes().size(); ++n) {
    if (state_.node(static_cast<int>(n)).authenticated)
      (void)links_->Send(static_cast<int>(n), msg);
  }
}

void Job::ShutdownAll() {
  ArmStopTimer();
  wire::Envelope env;
  env.mutable_shutdown();
  SendToAll(env);
}

void Job::Abort(bool kill_now) {
  ArmStopTimer();
  spdlog::info("stopping: {}", state_.outcome().reason);
  wire::Envelope env;
  env.mutable_abort()->set_reason(state_.outcome().reason);
  env.mutable_abort()->set_kill_now(kill_now);
  env.mutable_abort()->set_exit_status(state_.ExitStatus());
  SendToAll(env);
  for (size_t n = 0; n < state_.nodes().size(); ++n) {
    const NodeRecord& node = state_.node(static_cast<int>(n));
    // No workers yet: nothing to stop gracefully.
    if (!node.authenticated && !node.process_exited)
      starter_->Kill(static_cast<int>(n));
  }
  MaybeEnd();
}

void Job::ArmStopTimer() {
  start_timer_.cancel();
  if (stop_timer_armed_) return;
  stop_timer_armed_ = true;
  if (starter_) starter_->Stopping();
  // Agents SIGKILL their workers after the grace period; one that still has
  // not finished well after that is killed itself.
  stop_timer_.expires_after(Ms(options_.kill_grace_s + 5));
  stop_timer_.async_wait([this](const boost::system::error_code& ec) {
    if (ec) return;
    for (size_t n = 0; n < state_.nodes().size(); ++n) {
      const int node = static_cast<int>(n);
      if (state_.node(node).finished()) continue;
      console_.Note("agent of node " + std::to_string(node) + " (" +
                    plan_.nodes[node].host +
                    ") did not stop in time; killing it");
      starter_->Kill(node);
    }
    stop_timer_.expires_after(std::chrono::seconds(3));
    stop_timer_.async_wait([this](const boost::system::error_code& ec) {
      if (ec) return;
      state_.GiveUp();
      store_.FailAll("job ended");
      links_->Shutdown();
      io_.stop();
    });
  });
}

void Job::MaybeEnd() {
  if (!state_.MaybeEnd()) return;
  stop_timer_.cancel();
  watch_.Stop();
  store_.FailAll("job ended");
  links_->Shutdown();
  io_.stop();
}

}  // namespace dslaunch::launcher
