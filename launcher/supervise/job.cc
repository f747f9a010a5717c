#include "launcher/supervise/job.h"

#include <limits.h>  // PATH_MAX
#include <signal.h>
#include <spdlog/spdlog.h>
#include <unistd.h>  // getcwd

#include <algorithm>  // max

#include "base/exit_status.h"
#include "base/unix_time.h"
#include "launcher/plan/addresses.h"
#include "launcher/report/closing_report.h"
#include "proto/progress.h"  // EscapeControlChars

namespace dslaunch::launcher {

namespace asio = boost::asio;

static std::string WorkingDirectory() {
  char cwd[PATH_MAX] = {0};
  return ::getcwd(cwd, sizeof(cwd)) ? cwd : "";
}

static JobSpecParts SpecParts(const LaunchOptions& o, const StartMode& mode,
                              std::string job_id, EnvList job_env,
                              RankCommand command) {
  JobSpecParts p;
  p.job_id = std::move(job_id);
  p.env = std::move(job_env);
  p.command = std::move(command);
  p.cwd = WorkingDirectory();
  p.kill_grace_s = o.kill_grace_s;
  p.heartbeat_interval_s = o.heartbeat_interval_s;
  p.heartbeat_timeout_s = o.heartbeat_timeout_s;
  p.bind_cores_to_rank = o.bind_cores_to_rank;
  p.bind_cores = o.bind_cores;
  p.slurm_task_env = mode.RanksAreSlurmTasks(o.hosts_from_slurm);
  p.max_restarts = o.max_restarts;
  p.no_progress_hook = o.no_progress_hook;
  return p;
}

Job::Job(asio::io_context& io, const LaunchOptions& options, Plan plan,
         EnvList job_env, RankCommand command, Console& console,
         std::string job_id, std::string secret)
    : options_(options),
      pool_(AgentPool(plan)),
      console_(console),
      gate_(std::move(secret), options.master_port_given),
      state_(plan, options.max_restarts, options.node_cooldown_s),
      store_(io),
      watch_(io, options, console,
             {[this](const std::vector<int>& ranks, const std::string& why) {
                forensics_.CollectStacks(ranks, why);
              },
              [this](int rank, const std::string& why) {
                forensics_.AbortForHang(rank, why);
              }}),
      generations_(
          options, console, state_, store_, watch_, std::move(plan),
          SpecParts(options, StartModeNamed(options.launcher),
                    std::move(job_id), std::move(job_env), std::move(command))),
      forensics_(io, options, console, state_,
                 {[this](int node, const wire::Envelope& msg) {
                    (void)links_->Send(node, msg);
                  },
                  [this](int rank, const std::string& why) {
                    stop_.Act(state_.Hung(rank, why));
                  }}),
      traffic_(state_, console, forensics_),
      restarts_(io, options, console, state_, pool_,
                generations_.plan().min_nodes > 0
                    ? generations_.plan().min_nodes
                    : static_cast<int>(generations_.plan().nodes.size()),
                static_cast<int>(generations_.plan().nodes.size()),
                {[this](const std::string& why) { GiveUpRestart(why); },
                 [this](const std::vector<int>& agents) {
                   generations_.StartNext(agents, pool_, join_.has_value(),
                                          restarts_.FreePort(agents.at(0)));
                 },
                 [this](const std::string& why) { Grow(why); },
                 [this](int agent) { gate_.StartingAgain(agent); },
                 [this](int agent) { generations_.Retire(agent); }}),
      stop_(io, options, console, state_, pool_, restarts_,
            {[this] { StartTimedOut(); }, [this] { Ended(); }}) {
  if (StartModeNamed(options.launcher).each_generation_starts)
    state_.SetAgentsRunOneGeneration();
  if (StartModeNamed(options.launcher).agents_join) {
    join_.emplace(io, options, console, state_,
                  static_cast<int>(this->plan().nodes.size()),
                  [this](StatusOr<JoinedPlan> joined) {
                    StartJoinedJob(std::move(joined));
                  });
  }
}

Job::~Job() = default;

std::optional<std::string> Job::NodeSecret(int node_rank) const {
  return gate_.NodeSecret(node_rank);
}

void Job::Start(Starter* starter, AgentLinks* links, int control_port) {
  starter_ = starter;
  links_ = links;
  generations_.SetLinks(links);
  restarts_.SetStarter(starter);
  gate_.Started(starter->AgentsMakeSecrets());
  state_.Launched();
  stop_.Start(starter, links);
  watch_.Start();
  if (join_) join_->Start(control_port, state_.launch_time());
  AgentBootstrap boot{&pool_, &options_, generations_.spec().job_id,
                      gate_.job_secret(), control_port};
  starter_->Start(boot, [this](StatusOr<Starter::Started> started) {
    OnStarted(std::move(started));
  });
}

void Job::OnStarted(StatusOr<Starter::Started> started) {
  if (!started.ok()) {
    console_.Note(started.status().message());
    if (state_.phase() == Phase::kStarting) {
      state_.StartFailed(started.status());
      return stop_.End();
    }
    // Already stopping (interrupted meanwhile): what was not started never
    // will be, and no process of it will report its end.
    for (size_t n = 0; n < state_.nodes().size(); ++n) {
      const NodeRecord& node = state_.node(static_cast<int>(n));
      if (!node.authenticated && !node.process_exited)
        stop_.Act(state_.AgentProcessExited(static_cast<int>(n),
                                            "was never started"));
    }
    return stop_.MaybeEnd();
  }
  if (state_.phase() != Phase::kStarting) return;  // interrupted meanwhile
  if (options_.plan.master_addr.empty() && !started->master_addr.empty())
    generations_.mutable_plan().master_addr = started->master_addr;
  spdlog::info("agents started on {} nodes", pool_.nodes.size());
}

void Job::StartTimedOut() {
  const std::string why =
      (join_ ? "no agent joined as this node within "
             : "its agent did not connect within ") +
      std::to_string(static_cast<int>(options_.start_timeout_s)) + " s";
  if (join_) join_->SayTimedOut();
  for (size_t n = 0; n < state_.nodes().size(); ++n) {
    if (!state_.node(static_cast<int>(n)).authenticated)
      stop_.Act(state_.NodeLost(static_cast<int>(n), why));
  }
  // Only spares were missing: the others wait no longer.
  if (state_.phase() == Phase::kStarting) {
    for (int n : gate_.Release(state_)) generations_.SendJobSpec(n);
  }
}

void Job::Ended() {
  restarts_.Stop();
  if (join_) join_->Stop();
  watch_.Stop();
  store_.FailAll("job ended");
}

void Job::OnAgentSecret(int node_rank, std::string secret) {
  const bool in = node_rank >= 0 &&
                  node_rank < static_cast<int>(state_.nodes().size()) &&
                  state_.node(node_rank).authenticated;
  switch (gate_.OnSecretLine(node_rank, std::move(secret), in)) {
    case AgentGate::Line::kKept:
      return links_->NodeSecretKnown(node_rank);  // its Hello goes on
    case AgentGate::Line::kIgnored:
      // It must not end the job in the agent's name.
      return console_.Note(
          "ignored a secret line for node " + std::to_string(node_rank) +
          " after its agent authenticated (not written by the agent)");
    case AgentGate::Line::kTwice:
      links_->NodeSecretKnown(node_rank);  // known to prove nothing
      return stop_.Act(
          state_.NodeLost(node_rank, "two agents claimed the node"));
  }
}

void Job::OnStarterOutput(const std::string& source, std::string line) {
  console_.Relay("[" + source + " agent] " + proto::EscapeControlChars(line));
}

void Job::OnAgentAuthenticated(int node_rank, const wire::Hello& hello,
                               const std::string& agent_addr) {
  gate_.Spend(node_rank);  // a secret its agent made: one connection
  spdlog::info("node {} ({}) joined: agent pid {}, {} cores, {} GPUs",
               node_rank, proto::EscapeForLog(hello.facts().hostname(), 255),
               hello.facts().agent_pid(), hello.facts().cpu_cores(),
               hello.facts().gpus_size());
  const NodeRecord& record = state_.node(node_rank);
  const bool live = state_.restart_pending() ||
                    state_.phase() == Phase::kStarting ||
                    state_.phase() == Phase::kRunning;
  const bool back = !record.lost_reason.empty() &&
                    (state_.restart_pending() || !record.member);
  const bool standby = live && (back || !record.member);
  if (Status st = state_.NodeAuthenticated(node_rank); !st.ok()) {
    spdlog::warn("{}", st.message());
    return;
  }
  state_.NodeAddress(node_rank, agent_addr);
  starter_->AgentIn(node_rank, {hello.facts().agent_pid(),
                                hello.facts().agent_start_ticks()});
  restarts_.NoteFreePort(node_rank, hello.facts().free_port());
  if (standby) {
    // A lost node's new agent, or a spare: it waits for a generation.
    if (back && join_) {
      // A restarted pod may run elsewhere: its name now.
      const std::string& name = hello.facts().hostname();
      pool_.nodes[node_rank].host =
          proto::EscapeForLog(name.empty() ? agent_addr : name, 255);
    }
    if (back) {
      console_.Note("node " + std::to_string(node_rank) + " (" +
                    pool_.nodes[node_rank].host + ") is back");
    } else {
      spdlog::info("node {} ({}) stands by", node_rank,
                   pool_.nodes[node_rank].host);
    }
    generations_.StandBy(node_rank);
    // A spare in last: the first generation's JobSpecs waited for its
    // secret to be spent.
    if (state_.phase() == Phase::kStarting && !state_.restart_pending()) {
      for (int n : gate_.Release(state_)) generations_.SendJobSpec(n);
    }
    return TendRestart();
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
  if (join_) return join_->OnJoined(node_rank, hello, agent_addr);
  if (node_rank == 0 && !options_.plan.master_addr.empty()) {
    const std::string warning =
        MasterAddrWarning(options_.plan.master_addr, plan().nodes[0].host,
                          agent_addr, AddressLookup::System());
    if (!warning.empty()) console_.Note(warning);
  }
  if (node_rank == 0 && !gate_.master_port_known()) {
    gate_.SetMasterPortKnown();
    int port = hello.facts().free_port();
    if (port > 65535) port = 0;  // not a port: the default
    if (port > 0) generations_.mutable_plan().master_port = port;
    console_.Note("MASTER_PORT " + std::to_string(plan().master_port) + ": " +
                  (port > 0
                       ? "a free port on node 0 (" + plan().nodes[0].host + ")"
                       : "node 0 (" + plan().nodes[0].host +
                             ") reported no free port; the default") +
                  "; --master_port chooses another");
  }
  for (int n : gate_.Admit(node_rank, state_)) generations_.SendJobSpec(n);
}

// --launcher join: the plan is the agents' now.
void Job::StartJoinedJob(StatusOr<JoinedPlan> joined) {
  if (!joined.ok()) return FailJoinedStart(joined.status());
  if (!joined->warning.empty()) console_.Note(joined->warning);
  generations_.mutable_plan() = std::move(joined->plan);
  const Plan& plan = generations_.plan();
  pool_ = AgentPool(plan);
  state_.Replan(plan);
  // Claims nobody took (--num_nodes MIN:MAX): lost, and waited for; an
  // agent that joins as one later grows the job.
  for (const NodePlan& spare : plan.spares) {
    stop_.Act(state_.NodeLost(spare.agent, "no agent joined as it"));
    stop_.Act(state_.AgentProcessExited(spare.agent, "did not join"));
  }
  if (Status st = join_->PlanFinal(plan); !st.ok()) return FailJoinedStart(st);
  console_.Note(
      (!plan.spares.empty()
           ? std::to_string(plan.nodes.size()) + " of " +
                 std::to_string(pool_.nodes.size()) + " agents joined: "
       : plan.nodes.size() == 1
           ? std::string("the agent joined: ")
           : "all " + std::to_string(plan.nodes.size()) + " agents joined: ") +
      Plural(static_cast<size_t>(plan.world_size), "rank") + ", MASTER_ADDR " +
      plan.master_addr + ":" + std::to_string(plan.master_port) + " (node 0, " +
      plan.nodes[0].host + ")");
  gate_.SetMasterPortKnown();
  for (const NodePlan& node : plan.nodes) generations_.SendJobSpec(node.agent);
}

void Job::FailJoinedStart(const Status& why) {
  console_.Note(why.message());
  state_.StartFailed(why);
  wire::Envelope env;
  env.mutable_abort()->set_reason(why.message());
  env.mutable_abort()->set_kill_now(true);
  env.mutable_abort()->set_exit_status(state_.ExitStatus());
  stop_.SendToAll(env);
  stop_.EndSoon();
}

void Job::OnAgentMessage(int node_rank, wire::Envelope&& msg) {
  if (traffic_.Route(node_rank, msg)) return;
  switch (msg.msg_case()) {
    case wire::Envelope::kWorkerStarted:
      return HandleWorkerStarted(node_rank, msg.worker_started());
    case wire::Envelope::kWorkerExited:
      return HandleWorkerExited(node_rank, msg.worker_exited());
    case wire::Envelope::kAgentSignalled:
      return HandleAgentSignalled(node_rank, msg.agent_signalled().signal());
    case wire::Envelope::kStoreRequest:
      return HandleStore(node_rank, msg.store_request());
    case wire::Envelope::kGenerationEnded:
      return HandleGenerationEnded(node_rank, msg.generation_ended());
    case wire::Envelope::kAgentDone:
      spdlog::info("node {} done", node_rank);
      state_.NodeDone(node_rank);
      return;
    default:
      spdlog::warn("node {}: unexpected {}", node_rank,
                   proto::MessageName(msg));
  }
}

void Job::HandleWorkerStarted(int node_rank, const wire::WorkerStarted& s) {
  auto action = state_.RankStarted(node_rank, s.rank(), s.pid());
  if (!action.ok())
    return spdlog::warn("node {}: {}", node_rank, action.status().message());
  // Stamped with this host's clock, as records are.
  console_.board().Started(s.rank(), s.pid(), base::SteadySeconds());
  stop_.Act(*action);
  // Running now: a node that came back meanwhile may grow it.
  if (state_.phase() == Phase::kRunning) TendRestart();
}

void Job::HandleWorkerExited(int node_rank, const wire::WorkerExited& e) {
  auto action = state_.RankExited(node_rank, e.rank(), e.exit_code(),
                                  e.signal(), e.time(), e.error(), e.stopped());
  if (!action.ok())
    return spdlog::warn("node {}: {}", node_rank, action.status().message());
  console_.board().Exited(e.rank(), e.exit_code(), e.signal(), e.oom_killed());
  forensics_.OnExited(e);
  console_.EndOfOutput(e.rank());
  if (!e.error().empty())
    console_.Note("rank " + std::to_string(e.rank()) + ": " + e.error());
  stop_.Act(*action);
  stop_.MaybeEnd();
}

void Job::HandleGenerationEnded(int node_rank, const wire::GenerationEnded& e) {
  if (Status st = state_.NodeIdle(node_rank); !st.ok())
    return spdlog::warn("node {}: {}", node_rank, st.message());
  restarts_.NoteFreePort(node_rank, e.free_port());
  TendRestart();
}

void Job::TendRestart() {
  if (state_.ReadyToRestart()) {
    stop_.RestartDue();
  }
  restarts_.Tend();
}

void Job::GiveUpRestart(const std::string& why) {
  console_.Note(why);
  state_.GiveUpRejoin(why);
  // The waiting agents exit; those started again that have not come back
  // are killed (Abort).
  stop_.Act(JobState::Action::kAbortAll);
}

void Job::Grow(const std::string& why) {
  if (state_.Grow(why)) stop_.Act(JobState::Action::kAbortAll);
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
  restarts_.Disconnected(node_rank);
  // A joined agent that leaves while the job assembles frees its node.
  if (join_ && join_->Assembling(node_rank) &&
      state_.NodeLeftBeforeStart(node_rank))
    return join_->Left(node_rank, why);
  stop_.Act(state_.NodeDisconnected(
      node_rank, why.ok() ? std::string("closed") : why.message()));
  // Where the start tool's daemons own the agent process (mpirun), an agent
  // that said it is done and closed has ended as far as we can tell.
  // A joined agent is not ours to wait for: its connection is all of it.
  if (starter_ && !starter_->SeesAgentProcesses() &&
      (join_ || state_.node(node_rank).done))
    stop_.Act(state_.AgentProcessExited(node_rank, "ended"));
  TendRestart();
  stop_.MaybeEnd();
}

void Job::OnAgentProcessExited(int node_rank, const std::string& how) {
  gate_.Spend(node_rank);  // its agent is gone: its secret proves nothing
  stop_.Act(state_.AgentProcessExited(node_rank, how));
  TendRestart();
  stop_.MaybeEnd();
}

void Job::OnSignal(int sig) {
  const JobState::Action action = state_.Interrupted(sig);
  if (action == JobState::Action::kAbortAll) {
    console_.Note("interrupted (" + SignalName(sig) +
                  "); stopping every rank (again to kill at once)");
  } else if (action == JobState::Action::kKillAll) {
    console_.Note("killing every rank now");
  }
  stop_.Act(action);
}

void Job::OnStoppedByScheduler(const std::string& why) {
  StoppedFromOutside(SIGTERM, why);
}

void Job::StoppedFromOutside(int sig, const std::string& why) {
  const JobState::Action action = state_.StoppedFromOutside(sig, why);
  if (action == JobState::Action::kAbortAll)
    console_.Note(why + "; stopping every rank");
  stop_.Act(action);
}

// An agent signalled by someone else stops its ranks: they die of that, not
// of a failure of their own. Under SLURM it is SLURM ending the step.
void Job::HandleAgentSignalled(int node_rank, int sig) {
  const std::string& host = pool_.nodes[node_rank].host;
  StoppedFromOutside(
      sig, StartModeNamed(options_.launcher).scheduler_signals_agents
               ? "SLURM stopped the step (" + SignalName(sig) +
                     " to the agent on " + host + ")"
               : "the agent on " + host + " received " + SignalName(sig) +
                     " from outside dslaunch");
}

int Job::Finish() {
  return PrintClosingReport(
      {state_, plan(), state_.launch_time(), traffic_.malformed(),
       traffic_.dropped(), watch_.hangs(), forensics_.stacks(),
       forensics_.oom(), forensics_.error_files(), generations_.spec().env,
       gate_.job_secret(), options_.log_dir},
      console_);
}

}  // namespace dslaunch::launcher
