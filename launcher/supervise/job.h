// Job: supervises one job once its agents are being started. It hears the
// agents (through the control server), the starter and the user's signals,
// keeps the JobState, answers the store, routes output to the Console and
// keeps the rule the product exists for: the first failure (a rank's exit,
// a lost node, an interrupt) stops every rank everywhere. Join assembly
// (JoinAssembly), forensics (JobForensics), the periodic watch (JobWatch),
// the ranks' output and progress (RankTraffic), restart tending (Restarts),
// stopping agents and ending the job (JobStop) and the closing report
// (report/closing_report) are its parts. Agents are
// known by their fixed index (spares last); each generation's plan maps its
// node ranks to them. Owned by the Launcher (or a test, with fake agents and a
// FakeStarter); io_context thread only.
#pragma once

#include <boost/asio/io_context.hpp>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <string>

#include "launcher/options.h"
#include "launcher/plan/job_env.h"
#include "launcher/plan/job_spec.h"
#include "launcher/plan/joined_plan.h"
#include "launcher/plan/plan.h"
#include "launcher/plan/rank_command.h"
#include "launcher/report/console.h"
#include "launcher/start/start_mode.h"
#include "launcher/start/starter.h"
#include "launcher/state/job_state.h"
#include "launcher/supervise/agent_gate.h"
#include "launcher/supervise/control_server.h"
#include "launcher/supervise/generations.h"
#include "launcher/supervise/job_forensics.h"
#include "launcher/supervise/job_stop.h"
#include "launcher/supervise/job_watch.h"
#include "launcher/supervise/join_assembly.h"
#include "launcher/supervise/kv_store.h"
#include "launcher/supervise/rank_traffic.h"
#include "launcher/supervise/restarts.h"

namespace dslaunch::launcher {

class Job : public ControlServer::Delegate, public Starter::Delegate {
 public:
  // `job_env`: what every rank gets on top of its agent's environment.
  Job(boost::asio::io_context& io, const LaunchOptions& options, Plan plan,
      EnvList job_env, RankCommand command, Console& console,
      std::string job_id, std::string secret);
  ~Job() override;

  // Starts the agents through `starter`; they dial `control_port`. The job
  // then runs on the io_context, which is stopped when the job has ended.
  void Start(Starter* starter, AgentLinks* links, int control_port);
  // SIGINT, SIGTERM, SIGHUP: stop gracefully; again: kill at once.
  void OnSignal(int sig);
  // After the loop ended: the closing report; returns the exit status.
  int Finish();

  // The secret node_rank's agent must prove: the job's, or the one its agent
  // made and printed (pdsh, srun, mpirun); nullopt while it has not arrived
  // (or nothing was started yet), empty once used (it proves nothing).
  std::optional<std::string> NodeSecret(int node_rank) const;
  // --launcher join: called once every node has joined, with the plan made
  // from the agents (their hostnames and slot counts), before any JobSpec
  // goes out: the console opens the new ranks' logs. An error stops the job.
  void SetOnPlanFinal(std::function<Status(const Plan&)> f) {
    if (join_) join_->SetOnPlanFinal(std::move(f));
  }

  const JobState& state() const { return state_; }
  // The current generation's plan; every agent of the job (spares too),
  // by index: what the starter starts.
  const Plan& plan() const { return generations_.plan(); }
  const Plan& pool() const { return pool_; }
  int restarts() const { return state_.restarts(); }
  const std::string& job_id() const { return generations_.spec().job_id; }

  // ControlServer::Delegate
  void OnAgentAuthenticated(int node_rank, const wire::Hello& hello,
                            const std::string& peer_addr) override;
  void OnAgentMessage(int node_rank, wire::Envelope&& msg) override;
  void OnAgentDisconnected(int node_rank, const Status& why) override;
  // Starter::Delegate
  void OnAgentProcessExited(int node_rank, const std::string& how) override;
  void OnAgentSecret(int node_rank, std::string secret) override;
  void OnStarterOutput(const std::string& source, std::string line) override;
  void OnStoppedByScheduler(const std::string& why) override;
  void StoppedFromOutside(int sig, const std::string& why);
  void HandleAgentSignalled(int node_rank, int sig);

 private:
  void OnStarted(StatusOr<Starter::Started> started);
  // --start_timeout passed while starting: nodes not in are lost.
  void StartTimedOut();
  // The job ended: its parts stop (JobStop then ends the loop).
  void Ended();
  // --launcher join: every node joined; sends every JobSpec.
  void StartJoinedJob(StatusOr<JoinedPlan> joined);
  // The joined agents hear why (an Abort with the exit status) before the
  // launcher ends: none waits for a job that will not come.
  void FailJoinedStart(const Status& why);
  // Sends `agent` its JobSpec (its node of the generation's plan).
  void SendJobSpec(int agent);
  // An agent with no place in this generation waits, idle, for a later one.
  void StandBy(int agent);
  // Restarts::Tend, and the stop's timer is off once every rank is gone
  // (the wait for nodes has bounds of its own).
  void TendRestart();
  void HandleWorkerStarted(int node_rank, const wire::WorkerStarted& started);
  void HandleWorkerExited(int node_rank, const wire::WorkerExited& exited);
  // --max_restarts: the node's agent ended its ranks and waits.
  void HandleGenerationEnded(int node_rank, const wire::GenerationEnded& e);
  void GiveUpRestart(const std::string& why);
  // The next generation on `agents`: node ranks and ranks renumbered.
  void Grow(const std::string& why);
  void HandleStore(int node_rank, const wire::StoreRequest& request);

  const LaunchOptions& options_;
  Plan pool_;
  Console& console_;
  AgentGate gate_;  // each node's secret; when it gets its JobSpec
  JobState state_;
  KvStore store_;
  Starter* starter_ = nullptr;
  AgentLinks* links_ = nullptr;
  std::optional<JoinAssembly> join_;  // --launcher join only
  JobWatch watch_;
  Generations generations_;  // the plan; JobSpecs; the next generation
  JobForensics forensics_;
  RankTraffic traffic_;  // output, progress, stats and stacks of ranks
  Restarts restarts_;
  JobStop stop_;
};

}  // namespace dslaunch::launcher
