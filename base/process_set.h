// ProcessSet owns running child processes, in the manner of ninja's
// SubprocessSet: it spawns each child in its own process group (or session)
// with PR_SET_PDEATHSIG, reads its stdout/stderr through pipes on the
// io_context, cut into whole lines by one LineSplitter per stream, and hands
// lines and finished children to its Delegate. Reaping goes through the
// io_context's one ChildReaper, so several ProcessSets share one SIGCHLD
// handler and never take each other's children. A child counts as finished
// once reaped and both pipes reached end of stream (or a drain period after
// the reap passed: a grandchild may hold them), so its exit is always
// reported after its last line. Owned by its user; io_context thread only.
#pragma once

#include <signal.h>     // SIGKILL
#include <sys/types.h>  // pid_t

#include <boost/asio/io_context.hpp>
#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "base/status.h"

namespace dslaunch::base {

struct ProcessSpec {
  std::vector<std::string> argv;  // argv[0]: program, searched in PATH
  std::vector<std::string> env;   // "KEY=VALUE": the child's whole environment
  bool inherit_env = false;       // true: the parent's environment, then env
  std::string cwd;                // empty = the parent's
  bool new_session = false;       // setsid() instead of a new process group
  int death_signal = SIGKILL;     // PR_SET_PDEATHSIG
  bool stdin_pipe = false;        // false: /dev/null; true: a pipe we keep
  // With stdin_pipe false: a descriptor of ours (a socket) that becomes the
  // child's stdin; the caller keeps and closes it (-1 = /dev/null).
  int stdin_fd = -1;
  bool capture_output = true;  // false: stdout/stderr are the parent's
  // A cgroup v2 directory the child joins before it execs ("" = none).
  std::string cgroup_dir;
  // CPUs the child is bound to before it execs (empty = not bound).
  std::vector<int> cpus;
  // Sent to the child's group when the ProcessSet goes first (0 = none).
  int destroy_signal = SIGKILL;
  // PR_SET_PTRACER: this process and its descendants may ptrace the child
  // where Yama's ptrace_scope 1 allows only ancestors (0 = none). Never the
  // parent for ranks: every rank descends from it (agent/stack_helper.h).
  pid_t tracer = 0;
};

struct ExitInfo {
  int exit_code = 0;    // valid when signal == 0
  int signal = 0;       // the signal that ended the process, or 0
  int wait_status = 0;  // as waitpid gave it
  std::string error;    // set when the program could not be started
  // Signal/SignalAll reached it while it still ran: an end of the owner's
  // making (one that had already ended when signalled is not).
  bool signalled = false;
};

class ProcessSet {
 public:
  class Delegate {
   public:
    virtual ~Delegate() = default;
    virtual void OnProcessOutput(pid_t pid, bool is_stderr, std::string line,
                                 bool partial) = 0;
    virtual void OnProcessExited(pid_t pid, const ExitInfo& info) = 0;
  };

  ProcessSet(boost::asio::io_context& io, Delegate* delegate);
  // Sends each unreaped child's destroy_signal to its group; the reaper
  // still reaps them later.
  ~ProcessSet();
  ProcessSet(const ProcessSet&) = delete;
  ProcessSet& operator=(const ProcessSet&) = delete;

  // Starts a child. A program that cannot be executed still yields a pid:
  // the child exits 127 and the exit carries the reason in ExitInfo::error.
  StatusOr<pid_t> Spawn(const ProcessSpec& spec);
  // Our end of the child's stdin (spec.stdin_pipe), or -1. Closed by us
  // when the child is reported finished, or by CloseStdin.
  int StdinOf(pid_t pid) const;
  void CloseStdin(pid_t pid);
  // Sends `sig` to the process group of one / every child not yet reaped;
  // one still running is marked ExitInfo::signalled.
  void Signal(pid_t pid, int sig);
  void SignalAll(int sig);
  // Stop/restart reading output (backpressure from the owner's consumer).
  void PauseOutput();
  void ResumeOutput();
  // Children spawned and not yet reported finished.
  size_t unfinished() const { return children_.size(); }
  void set_drain_after_exit(std::chrono::milliseconds d) { drain_after_ = d; }

  struct Child;  // defined in process_set.cc

 private:
  void OnReaped(const std::shared_ptr<Child>& c, int status);
  void ArmDrainTimer(const std::shared_ptr<Child>& c);
  void ReadExecReport(const std::shared_ptr<Child>& c);
  void StartRead(const std::shared_ptr<Child>& c, bool is_stderr);
  void OnRead(const std::shared_ptr<Child>& c, bool is_stderr,
              const boost::system::error_code& ec, size_t n);
  void CloseStream(const std::shared_ptr<Child>& c, bool is_stderr);
  void MaybeFinish(const std::shared_ptr<Child>& c);

  boost::asio::io_context& io_;
  Delegate* delegate_;
  std::map<pid_t, std::shared_ptr<Child>> children_;
  bool paused_ = false;
  std::chrono::milliseconds drain_after_{2000};
  std::shared_ptr<bool> alive_ = std::make_shared<bool>(true);
};

// Finds `program` the way execvp would, in the PATH given; a name with a
// slash is taken as is. NotFound when nothing executable matches. With
// `accept`, a candidate it refuses is passed over.
StatusOr<std::string> ResolveProgram(
    const std::string& program, const std::string& path_env,
    const std::function<Status(const std::string&)>& accept = nullptr);

}  // namespace dslaunch::base
