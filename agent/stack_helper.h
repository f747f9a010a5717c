// The stack helper: the one process of a node that may trace its ranks. The
// agent starts it (dsagent --stack_helper, a child of the agent) before any
// rank, and each rank names only it with PR_SET_PTRACER. Under Yama's
// ptrace_scope 1 a declared tracer AND ITS DESCENDANTS may trace: had the
// ranks named the agent, of which every rank descends, any rank could trace
// any other. No rank descends from the helper; its stack tools do.
//
// StackHelperClient is the agent's side: it spawns the helper with one end
// of a socketpair as its stdin and speaks length-delimited Envelopes to it
// (StackRequest out, one Stacks back per collection). Owned by RankMonitor;
// io_context thread only. RunStackHelper is the helper's side, a
// StackCollector (stack_collector.h) on the helper's own io_context.
#pragma once

#include <sys/types.h>  // pid_t

#include <boost/asio/io_context.hpp>
#include <boost/asio/steady_timer.hpp>
#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "base/process_set.h"
#include "base/status.h"
#include "proto/channel.h"
#include "proto/dslaunch.pb.h"

namespace dslaunch::agent {

// The flag that makes dsagent the stack helper (its only argument).
inline constexpr char kStackHelperFlag[] = "--stack_helper";
// This dsagent binary as the stack helper: /proc/self/exe --stack_helper.
std::vector<std::string> StackHelperCommand();

struct StackHelperOptions {
  // The helper's command, argv[0] a path (StackHelperCommand() in
  // dsagent); empty: none is started and every collection is answered with
  // an error saying so.
  std::vector<std::string> argv;
  std::string path_env;  // the tools' PATH in the helper ("" = the agent's)
  // A collection the helper has not answered by then is answered with an
  // error. The helper's own limit is 20 s per rank (StackToolOptions), the
  // launcher waits 25 s: this is the backstop for a helper that hangs.
  std::chrono::milliseconds answer_within{22000};
};

class StackHelperClient : private base::ProcessSet::Delegate {
 public:
  using Reply = std::function<void(const wire::Stacks&)>;

  StackHelperClient(boost::asio::io_context& io, Reply reply,
                    StackHelperOptions options = {});
  // Closes the connection and SIGKILLs the helper's group; no more replies.
  ~StackHelperClient() override;
  StackHelperClient(const StackHelperClient&) = delete;
  StackHelperClient& operator=(const StackHelperClient&) = delete;

  // Starts the helper on the first call; its pid while it runs, else 0 (it
  // could not start, or is gone: a stale pid could name another process).
  // The tracer every rank names: call before spawning each.
  pid_t Tracer();
  // As StackCollector: exactly one reply per collection (maybe at once),
  // within answer_within; one for a rank being collected is merged.
  void Collect(int rank, pid_t pid);
  // `rank` exited: the helper traces it no more (its pid may be reused).
  void Exited(int rank);
  // Ends the helper (EOF on its connection: it kills its tools and exits)
  // and answers nothing more.
  void Stop();
  size_t pending() const { return pending_.size(); }

 private:
  Status Start();
  void HandleMessage(wire::Envelope&& msg);
  // The helper is not usable any more: every pending collection gets an
  // error naming `why`, later ones at once.
  void OnHelperGone(const std::string& why);
  void Answer(const wire::Stacks& stacks);
  void AnswerError(int rank, const std::string& error);
  void OnProcessOutput(pid_t pid, bool is_stderr, std::string line,
                       bool partial) override;
  void OnProcessExited(pid_t pid, const base::ExitInfo& info) override;

  boost::asio::io_context& io_;
  Reply reply_;
  StackHelperOptions options_;
  base::ProcessSet process_;
  std::shared_ptr<proto::Channel> channel_;
  pid_t pid_ = 0;  // the helper, while it runs
  bool started_ = false;
  std::string gone_;  // why there is no helper ("" while it runs)
  bool stopped_ = false;
  // Collections sent and not yet answered, with their backstop timers; at
  // most one per rank of this node.
  std::map<int, std::unique_ptr<boost::asio::steady_timer>> pending_;
  std::shared_ptr<bool> alive_ = std::make_shared<bool>(true);
};

// The helper's side: serves StackRequests arriving on `fd` (its end of the
// socketpair) with a StackCollector until the agent closes it, then kills
// the tools still running and returns the process exit status.
int RunStackHelper(int fd);

}  // namespace dslaunch::agent
