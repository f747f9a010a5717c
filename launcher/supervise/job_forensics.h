// JobForensics: what the Job gathers for an operator after something went
// wrong: stacks of hung ranks (asked of their agents, kept bounded, shown
// and written to --log_dir), OOM kills and the error files failed Python
// ranks left. Under --on_hang abort it ends the job once the stacks asked
// for are in (their tools must not race the SIGTERM), or after 25 s at most.
// Owned by the Job; io_context thread only.
#pragma once

#include <boost/asio/io_context.hpp>
#include <boost/asio/steady_timer.hpp>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "launcher/options.h"
#include "launcher/report/console.h"
#include "launcher/state/job_state.h"
#include "proto/dslaunch.pb.h"

namespace dslaunch::launcher {

class JobForensics {
 public:
  struct Hooks {
    // Send `msg` to node `node` (authenticated).
    std::function<void(int node, const wire::Envelope& msg)> send;
    // --on_hang abort: end the job because `rank` hung.
    std::function<void(int rank, const std::string& why)> hung;
  };

  JobForensics(boost::asio::io_context& io, const LaunchOptions& options,
               Console& console, const JobState& state, Hooks hooks);

  // Asks the agents of the running ones among `ranks` for their stacks.
  void CollectStacks(const std::vector<int>& ranks, const std::string& why);
  // --on_hang abort because of `rank`: once the stacks asked for are in.
  void AbortForHang(int rank, const std::string& why);
  // A rank's stacks (of a rank of the node that sent them).
  void OnStacks(const wire::Stacks& stacks);
  // A rank's exit: its OOM kill and error file, if any.
  void OnExited(const wire::WorkerExited& exited);

  // rank -> what was kept, for the closing report and the failure bundle.
  const std::map<int, std::string>& stacks() const { return stacks_; }
  const std::map<int, std::string>& oom() const { return oom_; }
  const std::map<int, std::string>& error_files() const { return error_files_; }

 private:
  void FinishHangAbort();
  void KeepStacks(const wire::Stacks& stacks);  // console, file, memory

  const LaunchOptions& options_;
  Console& console_;
  const JobState& state_;
  Hooks hooks_;
  std::map<int, std::string> stacks_;  // rank -> collected (bounded)
  std::set<int> stacks_pending_;       // asked for, not yet come
  boost::asio::steady_timer hang_abort_timer_;
  std::optional<std::pair<int, std::string>> hang_abort_;  // rank, why
  std::map<int, std::string> oom_;          // rank -> the OOM kill's detail
  std::map<int, std::string> error_files_;  // rank -> its error file JSON
};

}  // namespace dslaunch::launcher
