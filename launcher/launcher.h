// Launcher: the top object of dslaunch. It turns the options into a Plan,
// starts one agent per node, serves them (control connection and store),
// prints their output, and enforces the failure semantics of design
// section 7: the first failed rank stops every other rank everywhere, and
// the exit status and closing report say what failed first. Owns the
// process's one io_context; everything runs on the thread calling Run().
//
// States (each transition logged once):
//   Starting -> Running -> Stopping -> Done
//   Starting/Running -> Stopping   (a rank failed, a node was lost, Ctrl-C,
//                                   every rank finished)
#pragma once

#include <boost/asio/io_context.hpp>
#include <boost/asio/signal_set.hpp>
#include <boost/asio/steady_timer.hpp>
#include <chrono>
#include <map>
#include <memory>
#include <optional>
#include <string>

#include "launcher/console.h"
#include "launcher/control_server.h"
#include "launcher/flags.h"
#include "launcher/job_env.h"
#include "launcher/kv_store.h"
#include "launcher/plan.h"
#include "launcher/ssh_starter.h"
#include "launcher/starter.h"

namespace dslaunch::launcher {

// One SSH target per node of `plan`: hostfile port=/user= over the flags.
std::vector<SshTarget> SshTargets(const LaunchOptions& options,
                                  const Plan& plan);

class Launcher : public ControlServer::Delegate, public Starter::Delegate {
 public:
  enum class State { kStarting, kRunning, kStopping, kDone };

  // `job_env`: what every rank gets on top of its agent's environment.
  Launcher(LaunchOptions options, Plan plan, EnvList job_env);
  ~Launcher() override;

  // Runs the job; returns the process exit status (design section 3).
  int Run();

  // ControlServer::Delegate
  void OnAgentAuthenticated(int node_rank, const wire::Hello& hello,
                            const std::string& peer_addr) override;
  void OnAgentMessage(int node_rank, wire::Envelope&& msg) override;
  void OnAgentDisconnected(int node_rank, const Status& why) override;
  // Starter::Delegate
  void OnAgentProcessExited(int node_rank, const std::string& how) override;
  void OnAgentSecret(int node_rank, std::string secret) override;

 private:
  struct RankState {
    int node_rank = 0;
    int pid = 0;
    bool started = false;
    bool exited = false;
    int exit_code = 0;
    int signal = 0;
    std::string error;
    double exit_time = 0;
    std::chrono::steady_clock::time_point exited_at;
  };
  struct NodeState {
    bool authenticated = false;
    bool disconnected = false;    // its control connection ended
    bool process_exited = false;  // the starter saw its agent process end
    std::string lost_reason;      // set when the node was lost
  };

  void SetState(State next);
  // The secret node_rank's agent must prove: the job's, or with pdsh the one
  // that agent made and printed; nullopt while it has not arrived.
  std::optional<std::string> NodeSecret(int node_rank) const;
  // launcher_start.cc: picks the starter (local or ssh), runs the ssh
  // preflight, and starts one agent per node.
  Status StartAgents(int port);
  Status StartPdsh(int port);
  void OnPreflightDone(int port, const std::vector<NodeCheck>& checks);
  std::vector<std::string> AgentArgv(int node_rank, std::string connect_host,
                                     int port) const;
  std::vector<AgentLaunch> MakeLaunches(
      int port, const std::vector<std::string>& connect_hosts);
  bool UseSsh() const;
  wire::JobSpec MakeJobSpec(int node_rank) const;
  void HandleWorkerExited(int node_rank, const wire::WorkerExited& exited);
  void HandleStore(int node_rank, const wire::StoreRequest& request);
  void OnNodeGone(int node_rank, const std::string& why);
  void BeginStopping(const std::string& reason);
  // Aborts every rank (SIGTERM, SIGKILL after the grace; at once if kill_now).
  void Stop(const std::string& reason, bool kill_now);
  bool NodeFinished(int node_rank) const;
  void MaybeDone();
  void WatchSignals();
  void PrintReport();  // launcher_report.cc
  void PrintFailure(int rank);
  void PrintConsequences();
  int ExitCode() const;
  const NodePlan& Node(int node_rank) const { return plan_.nodes[node_rank]; }

  LaunchOptions options_;
  Plan plan_;
  EnvList job_env_;
  boost::asio::io_context io_;
  State state_ = State::kStarting;
  std::string job_id_;
  std::string secret_;
  Console console_;
  // server_ before store_: parked store requests are failed (answered
  // through server_) when store_ is destroyed.
  ControlServer server_;
  KvStore store_;
  std::unique_ptr<Starter> starter_;
  boost::asio::signal_set signals_;
  boost::asio::steady_timer start_timer_;
  boost::asio::steady_timer stop_timer_;
  std::map<int, RankState> ranks_;
  std::map<int, std::string> node_secrets_;  // pdsh only
  std::vector<NodeState> nodes_;
  std::optional<int> first_failed_rank_;
  std::optional<int> lost_node_;
  std::string stop_reason_;
  bool interrupted_ = false;
  bool preflight_failed_ = false;
  int interrupts_ = 0;
  int interrupt_signal_ = 0;
  size_t started_ranks_ = 0;
  size_t exited_ranks_ = 0;
  std::map<int, int64_t> malformed_progress_;  // rank -> records dropped
  std::map<int, int64_t> dropped_progress_;  // rank -> dropped by its agent
  std::chrono::steady_clock::time_point start_time_;
  std::chrono::steady_clock::time_point stop_time_;
  std::chrono::steady_clock::time_point done_time_;
};

}  // namespace dslaunch::launcher
