// Job: supervises one job once its agents are being started. It hears the
// agents (through the control server), the starter and the user's signals,
// keeps the JobState, answers the store, routes output to the Console and
// enforces design section 7: the first failure stops every rank everywhere.
// Owned by the Launcher (or a test, with fake agents and a FakeStarter);
// io_context thread only.
#pragma once

#include <boost/asio/io_context.hpp>
#include <boost/asio/steady_timer.hpp>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <string>

#include "launcher/flags.h"
#include "launcher/plan/job_env.h"
#include "launcher/plan/plan.h"
#include "launcher/plan/rank_command.h"
#include "launcher/report/console.h"
#include "launcher/start/start_mode.h"
#include "launcher/start/starter.h"
#include "launcher/supervise/control_server.h"
#include "launcher/supervise/job_state.h"
#include "launcher/supervise/job_watch.h"
#include "launcher/supervise/kv_store.h"

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
    on_plan_final_ = std::move(f);
  }

  const JobState& state() const { return state_; }
  const Plan& plan() const { return plan_; }
  const std::string& job_id() const { return job_id_; }

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
  void ArmStartTimer();
  // --launcher join: records a joined node; once all have, makes the plan
  // from them and sends every JobSpec.
  void OnNodeJoined(int node_rank, const wire::Hello& hello,
                    const std::string& agent_addr);
  void StartJoinedJob();
  void FailJoinedStart(const Status& why);
  // A joined node's agent left while others are still missing: its node is
  // free again and the job keeps assembling (true); false once the job was
  // planned (then it is lost as under every mode).
  bool OnJoinedNodeLeft(int node_rank, const Status& why);
  // "1,3-5": the node ranks no agent has joined as yet.
  std::string MissingNodes() const;
  // While agents are missing, one line every few seconds says which.
  void ArmJoinWaitTimer();
  // Sends node_rank its JobSpec once the master port is known.
  void SendJobSpec(int node_rank);
  // Whether every node's agent has authenticated, or the starter's agents
  // prove AgentBootstrap::secret (then nodes need not wait for each other).
  bool EveryAgentIn() const;
  wire::JobSpec MakeJobSpec(int node_rank) const;
  void HandleWorkerStarted(int node_rank, const wire::WorkerStarted& started);
  void HandleWorkerExited(int node_rank, const wire::WorkerExited& exited);
  void HandleProgress(int node_rank, const wire::ProgressBatch& batch);
  // Whether `rank` runs on node_rank (else its entry is dropped, logged).
  bool RankOfNode(int rank, int node_rank) const;
  void HandleStore(int node_rank, const wire::StoreRequest& request);
  void Act(JobState::Action action);
  // Aborts every rank (SIGTERM, SIGKILL after the grace; at once if kill_now).
  void Abort(bool kill_now);
  void ShutdownAll();
  void ArmStopTimer();
  void MaybeEnd();
  void SendToAll(const wire::Envelope& msg);
  // job_report.cc
  void PrintOutcome();
  void PrintRankFailure(int rank);
  void PrintConsequences();
  // job_forensics.cc: stacks, OOM and error files, <log_dir>/failure/.
  void CollectStacks(const std::vector<int>& ranks, const std::string& why);
  // --on_hang abort: ends the job once the stacks asked for arrived (their
  // tools must not race the SIGTERM), or after kStacksWait at most.
  void AbortForHang(int rank, const std::string& why);
  void FinishHangAbort();
  void HandleStacks(int node_rank, const wire::Stacks& stacks);
  void KeepStacks(const wire::Stacks& stacks);  // console, file, memory
  void KeepExitForensics(const wire::WorkerExited& exited);
  void PrintForensics(int rank);
  void PrintHangs();
  void WriteFailureBundle();

  boost::asio::io_context& io_;
  const LaunchOptions& options_;
  Plan plan_;
  EnvList job_env_;
  RankCommand command_;
  Console& console_;
  std::string job_id_;
  std::string secret_;
  std::string cwd_;
  JobState state_;
  KvStore store_;
  Starter* starter_ = nullptr;
  AgentLinks* links_ = nullptr;
  boost::asio::steady_timer start_timer_;
  boost::asio::steady_timer stop_timer_;
  boost::asio::steady_timer join_wait_timer_;
  const StartMode& mode_;
  const bool join_;
  struct Joined {
    wire::NodeFacts facts;
    std::string addr;  // as the control server saw it: the node's address
  };
  std::map<int, Joined> joined_;
  std::function<Status(const Plan&)> on_plan_final_;
  int control_port_ = 0;
  // Secrets the agents made (Starter::AgentsMakeSecrets), emptied once used.
  std::map<int, std::string> node_secrets_;
  std::set<int> done_nodes_;  // agents that sent AgentDone
  // Nodes authenticated while the master port is unknown, or while another
  // node's agent has not authenticated (EveryAgentIn).
  std::vector<int> held_specs_;
  bool master_port_known_ = false;
  bool stop_timer_armed_ = false;
  std::map<int, int64_t> malformed_progress_;  // rank -> records dropped
  std::map<int, int64_t> dropped_progress_;    // rank -> dropped by its agent
  Clock::time_point start_time_;
  JobWatch watch_;
  std::map<int, std::string> stacks_;  // rank -> collected (bounded)
  std::set<int> stacks_pending_;       // asked for, not yet come
  boost::asio::steady_timer hang_abort_timer_;
  std::optional<std::pair<int, std::string>> hang_abort_;  // rank, why
  std::map<int, std::string> oom_;          // rank -> the OOM kill's detail
  std::map<int, std::string> error_files_;  // rank -> its error file JSON
};

}  // namespace dslaunch::launcher
