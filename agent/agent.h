// Agent: the top object of dsagent, one per node for the life of one job.
// It connects back to the launcher, authenticates, receives this node's part
// of the plan, runs the workers through a WorkerSet, relays their output,
// progress and exits, proxies store requests, and tears the workers down on
// abort, on launcher loss and on its own termination. A job that restarts
// (--max_restarts) runs several generations through the same agent and
// connection. It reaches the launcher through a LauncherLink and its ranks
// through Ranks (TCP and a WorkerSet; its tests pass fakes, AgentParts).
// Owns the process's one io_context; everything runs on the thread that
// calls Run().
//
// States (each transition logged once):
//   Connecting -> Spawning -> Running -> Draining -> Exited
//   Connecting -> Exited            (launcher unreachable or auth failed)
//   Connecting/Spawning/Running -> Draining
//                                   (abort, launcher lost, SIGTERM/INT/HUP)
//   Running -> Exited               (Shutdown after every worker is done)
//   Draining -> Idle                (an Abort with restart: every worker is
//                                    gone, GenerationEnded sent)
//   Idle -> Spawning                (the next generation's JobSpec)
//   Idle -> Exited                  (Abort, Shutdown, a signal, launcher lost)
#pragma once

#include <boost/asio/io_context.hpp>
#include <boost/asio/posix/stream_descriptor.hpp>
#include <boost/asio/signal_set.hpp>
#include <boost/asio/steady_timer.hpp>
#include <functional>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "agent/horovod_rendezvous.h"
#include "agent/launcher_link.h"
#include "agent/mpi_ranks.h"
#include "agent/progress_server.h"
#include "agent/rank_monitor.h"
#include "agent/ranks.h"
#include "agent/store_proxy.h"
#include "proto/dslaunch.pb.h"

namespace dslaunch::agent {

struct AgentOptions {
  std::string launcher_host;
  int launcher_port = 0;
  int node_rank = 0;
  std::string job_id;
  std::string secret;             // read from stdin by main, never from argv
  bool stdin_is_lifeline = true;  // EOF on stdin = the launcher is gone
  double connect_timeout_s = 30;
  // Started by mpirun (--launcher openmpi) as local rank 0 of its node: the
  // node's other MPI processes register with this agent, which starts each
  // rank with its process's MPI identity (mpi_ranks.h).
  std::optional<MpiPlacement> mpi;
  std::string mpi_key;  // what the holders prove (never the secret above)
  // Joining a `dslaunch --launcher join` job (dsagent --join): node_rank is
  // a claim (-1: any; the launcher's answer comes in the JobSpec), the
  // launcher is dialled again until connect_timeout_s while it cannot be
  // reached, and the exit status says whether the whole job succeeded (0),
  // failed (the launcher's status, else 1) or the launcher was lost (69).
  bool join = false;
  std::string join_rank_from;  // where the claim came from, for the log
  std::string ready_file;      // made once joined, removed at the end
  // Touched every second while the loop runs, removed at the end
  // (probe_files.h).
  std::string alive_file;
  // The stack helper's command (StackHelperCommand(); empty: stacks are
  // not collected). It starts before the first rank, which names it alone
  // as its tracer (stack_helper.h).
  std::vector<std::string> stack_helper;
};

// What the Agent reaches the world through, made on its io_context: the
// link to the launcher and its ranks. Unset: the real ones (MakeTcpLink, a
// WorkerSet).
struct AgentParts {
  std::function<std::unique_ptr<LauncherLink>(boost::asio::io_context&)> link;
  std::function<std::unique_ptr<Ranks>(boost::asio::io_context&,
                                       Ranks::Delegate*)>
      ranks;
};

class Agent : public Ranks::Delegate, public ProgressServer::Delegate {
 public:
  enum class State {
    kConnecting,
    kSpawning,
    kRunning,
    kDraining,
    kIdle,
    kExited
  };

  explicit Agent(AgentOptions options, AgentParts parts = {});
  ~Agent() override;

  // Runs the job to its end; returns the process exit status: 0 after an
  // orderly shutdown, 69 when the launcher was lost or never reached.
  int Run();

  // Ranks::Delegate
  void OnWorkerOutput(int rank, bool is_stderr, std::string line,
                      bool partial) override;
  void OnWorkerExited(int rank, pid_t pid, const ExitInfo& info) override;
  // ProgressServer::Delegate
  void OnProgressRecord(int rank, std::string json, double time) override;
  void OnMalformedProgress(int rank, const Status& why) override;

 private:
  // 600 -> "600", 0.5 -> "0.5".
  static std::string FormatSeconds(double s);
  void SetState(State next);
  // agent_connect.cc
  void Connect();
  void Dial();
  void DialFailed(bool resolving, const std::string& why);
  // `resolving`: the launcher's name did not resolve (asked at most once a
  // second).
  void RetryDial(const std::string& why, bool resolving = false);
  void OnClosed(const Status& st);
  void OnConnected();
  void HandleMessage(wire::Envelope&& msg);
  void HandleWelcome(const wire::Welcome& welcome);
  void HandleJobSpec(const wire::JobSpec& job);
  Status SetUpRunDir();
  void RemoveRunDir();
  std::string RankDirectory() const;
  // Spawns the ranks (once the node's MPI processes registered, under
  // mpirun); on failure every rank not started is reported and we drain.
  void ArmConnectTimer();
  void RemoveReadyFile();
  void MakeReadyFile();
  void MakeAliveFile();
  void TouchAliveFile();
  void StartWorkers();
  void FailSpawn(const Status& why);
  Status SpawnWorkers();
  void OnLauncherLost(const std::string& why);
  void Drain(bool kill_now, const std::string& why);
  // Every worker is gone: the generation ends (Idle) when the launcher said
  // it restarts the job, else the agent does (Finish).
  void WorkersGone();
  void EndGeneration();
  void Finish();
  void Send(const wire::Envelope& msg);
  void ScheduleFlush();
  void Flush();
  // True while the launcher's channel is over its soft limit: output pipes
  // and store sockets are not read then, and progress records wait (bounded,
  // the oldest dropped and counted) until it drains.
  bool Congested() const;
  void OnChannelDrained();
  void WatchSignals();
  void WatchStdin();
  void StartHeartbeats();
  void ArmHeartbeat();

  AgentOptions options_;
  boost::asio::io_context io_;
  State state_ = State::kConnecting;
  int exit_code_ = 0;
  std::unique_ptr<LauncherLink> link_;
  boost::asio::signal_set signals_;
  boost::asio::posix::stream_descriptor stdin_;
  boost::asio::steady_timer connect_timer_;
  boost::asio::steady_timer retry_timer_;
  int64_t dial_delay_ms_ = 50;  // the next retry's backoff
  std::string last_dial_error_;
  boost::asio::steady_timer heartbeat_timer_;
  boost::asio::steady_timer grace_timer_;
  std::chrono::steady_clock::time_point last_heard_;
  std::string client_nonce_;
  bool auth_sent_ = false;
  bool launcher_lost_ = false;
  bool ready_file_made_ = false;
  int alive_fd_ = -1;
  boost::asio::steady_timer alive_timer_;
  bool accepted_ = false;  // join: the launcher accepted us (1st heartbeat)
  bool connect_timer_armed_ = false;
  // The last Abort said the job restarts: stay for the next generation.
  bool restart_expected_ = false;
  wire::JobSpec job_;
  std::set<int> spawned_;  // ranks started
  std::string run_dir_;
  std::unique_ptr<Ranks> workers_;
  ProgressServer progress_;
  RankMonitor monitor_;  // RankStats, stacks, OOM and error-file verdicts
  StoreProxy store_;
  HorovodRendezvous horovod_;        // Horovod's Gloo workers' way into store_
  std::unique_ptr<MpiHolders> mpi_;  // --from_mpirun only
  // Output and progress collected since the last flush.
  wire::Envelope pending_logs_;
  size_t pending_log_bytes_ = 0;
  ProgressQueue pending_progress_;
  bool flush_scheduled_ = false;
  char stdin_byte_ = 0;
  uint64_t heartbeat_seq_ = 0;
  double heartbeat_interval_s_ = 1;  // the Welcome's, then the JobSpec's
  double heartbeat_timeout_s_ = 10;
};

}  // namespace dslaunch::agent
