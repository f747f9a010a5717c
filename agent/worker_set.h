// WorkerSet owns the agent's running workers, in the manner of ninja's
// SubprocessSet: it spawns each worker in its own process group with
// PR_SET_PDEATHSIG, reads its stdout/stderr through pipes on the io_context,
// reaps it on SIGCHLD (an asio::signal_set; no thread per child), and hands
// whole lines and finished workers to its Delegate. A worker counts as
// finished once it has been reaped and both pipes reached end of stream, so
// its exit is always reported after its last line. Use from the io_context's
// thread only.
#pragma once

#include <sys/types.h>  // pid_t

#include <boost/asio/io_context.hpp>
#include <boost/asio/signal_set.hpp>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "proto/status.h"

namespace dslaunch::agent {

struct WorkerSpec {
  int rank = 0;
  std::vector<std::string> argv;  // argv[0]: program, searched in env's PATH
  std::vector<std::string> env;   // "KEY=VALUE", the worker's whole environment
  std::string cwd;                // empty = the agent's
};

struct ExitInfo {
  int exit_code = 0;  // valid when signal == 0
  int signal = 0;     // the signal that ended the process, or 0
  std::string error;  // set when the program could not be started
};

class WorkerSet {
 public:
  class Delegate {
   public:
    virtual ~Delegate() = default;
    virtual void OnWorkerOutput(int rank, bool is_stderr, std::string line,
                                bool partial) = 0;
    virtual void OnWorkerExited(int rank, pid_t pid, const ExitInfo& info) = 0;
  };

  WorkerSet(boost::asio::io_context& io, Delegate* delegate);
  // SIGKILLs the process group of every worker still running.
  ~WorkerSet();
  WorkerSet(const WorkerSet&) = delete;
  WorkerSet& operator=(const WorkerSet&) = delete;

  // Starts a worker. A program that cannot be executed still yields a pid:
  // the child exits 127 and the exit carries the reason in ExitInfo::error.
  StatusOr<pid_t> Spawn(const WorkerSpec& spec);
  // Sends `sig` to the process group of every worker not yet reaped.
  void SignalAll(int sig);
  // Stop/restart reading worker output (backpressure from the channel).
  void PauseOutput();
  void ResumeOutput();
  // Workers spawned and not yet reported finished.
  size_t unfinished() const { return workers_.size(); }

  struct Worker;  // defined in worker_set.cc

 private:
  void WaitForSigchld();
  void ReapAll();
  void ArmDrainTimer(const std::shared_ptr<Worker>& w);
  void StartRead(const std::shared_ptr<Worker>& w, bool is_stderr);
  void OnRead(const std::shared_ptr<Worker>& w, bool is_stderr,
              const boost::system::error_code& ec, size_t n);
  void CloseStream(const std::shared_ptr<Worker>& w, bool is_stderr);
  void MaybeFinish(const std::shared_ptr<Worker>& w);

  boost::asio::io_context& io_;
  Delegate* delegate_;
  boost::asio::signal_set sigchld_;
  std::map<pid_t, std::shared_ptr<Worker>> workers_;
  bool paused_ = false;
  std::shared_ptr<bool> alive_ = std::make_shared<bool>(true);
};

// Finds `program` the way execvp would, in the PATH given; a name with a
// slash is taken as is. NotFound when nothing executable matches.
StatusOr<std::string> ResolveProgram(const std::string& program,
                                     const std::string& path_env);

}  // namespace dslaunch::agent
