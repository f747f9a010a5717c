// StackCollector collects the stacks of running ranks for the launcher
// (CollectStacks: a hang, a failure) without blocking the event loop: it runs
// a stack tool as a child (base::ProcessSet) per rank — py-spy for a Python
// interpreter when installed, else eu-stack (elfutils), else gdb, the next
// tried when one fails — with bounded output, at most a few at once and the
// rest queued. A rank's collection has `timeout` from its request, queueing
// and every tool included (a tool still running then is SIGKILLed), so its
// one reply always comes within that. Runs in the stack helper process
// (stack_helper.h), the one the ranks let trace them; io_context thread only.
#pragma once

#include <sys/types.h>  // pid_t

#include <boost/asio/io_context.hpp>
#include <chrono>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "base/process_set.h"
#include "proto/dslaunch.pb.h"

namespace dslaunch::agent {

struct StackToolOptions {
  // Where py-spy, eu-stack and gdb are looked for ("" = the agent's PATH).
  std::string path_env;
  std::chrono::milliseconds timeout{20000};  // per rank, from its request
  size_t max_text_bytes = 256 * 1024;        // the rest dropped, with a marker
  size_t max_running = 4;                    // tools at once
  size_t max_queued = 4096;                  // then refused with an error
};

// One tool invocation for a pid: its name ("eu-stack") and argv.
struct StackTool {
  std::string name;
  std::vector<std::string> argv;
};

// The tools to try for process `pid`, in order: py-spy when `is_python` and
// found, then eu-stack, then gdb, each the first in `path_env` that
// TrustedTool accepts (a tool runs under the stack helper, whose right to
// trace every rank it inherits: one a rank could replace is never run).
std::vector<StackTool> StackToolsFor(pid_t pid, bool is_python,
                                     const std::string& path_env);
// OK when `path`, links resolved, is a regular file of root's that only
// root can write, in directories of root's that only root can write (or
// sticky, as /tmp); else why not.
Status TrustedTool(const std::string& path);
// True when /proc/<pid>/exe's name starts with "python".
bool IsPythonProcess(pid_t pid);

class StackCollector : private base::ProcessSet::Delegate {
 public:
  using Reply = std::function<void(const wire::Stacks&)>;

  StackCollector(boost::asio::io_context& io, Reply reply,
                 StackToolOptions options = {});
  ~StackCollector() override;
  StackCollector(const StackCollector&) = delete;
  StackCollector& operator=(const StackCollector&) = delete;

  // Collects the stacks of `rank`, whose main process is `pid`; exactly one
  // reply follows (maybe at once). A rank already queued or being collected
  // is merged into that collection.
  void Collect(int rank, pid_t pid);
  // `rank` exited (its pid may be reused from now on): a queued collection
  // is answered with that at once; a running one tries no further tool and
  // never signals the pid again.
  void Exited(int rank);
  // Kills the running tools and forgets the queue; no more replies.
  void Stop();
  size_t running() const { return running_.size(); }
  size_t queued() const { return queue_.size(); }

  struct Job;  // defined in stack_collector.cc

 private:
  void StartQueued();
  void RunNextTool(const std::shared_ptr<Job>& job);
  void Finish(const std::shared_ptr<Job>& job);
  void OnProcessOutput(pid_t pid, bool is_stderr, std::string line,
                       bool partial) override;
  void OnProcessExited(pid_t pid, const base::ExitInfo& info) override;

  boost::asio::io_context& io_;
  Reply reply_;
  StackToolOptions options_;
  base::ProcessSet tools_;
  std::deque<std::shared_ptr<Job>> queue_;
  std::map<pid_t, std::shared_ptr<Job>> running_;  // by the tool's pid
  std::map<int, std::shared_ptr<Job>> by_rank_;    // queued or running
  bool stopped_ = false;
};

}  // namespace dslaunch::agent
