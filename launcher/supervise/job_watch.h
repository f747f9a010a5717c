// JobWatch: the launcher's periodic look at a running job. Ten times a
// second it lets the console fold and redraw; once a second it names ranks
// that sent no progress record for --hang_timeout while still running (their
// stacks are asked for; --on_hang abort ends the job) and ranks whose step
// time is far above the job's median (stragglers, warned once each). Owned
// by the Job; io_context thread only.
#pragma once

#include <boost/asio/io_context.hpp>
#include <boost/asio/steady_timer.hpp>
#include <functional>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "launcher/options.h"
#include "launcher/report/console.h"

namespace dslaunch::launcher {

class JobWatch {
 public:
  struct Hooks {
    // Ask the ranks' agents for their stacks; `reason` for the agents' logs.
    std::function<void(const std::vector<int>& ranks, const std::string&)>
        collect_stacks;
    // --on_hang abort: end the job because of `rank`.
    std::function<void(int rank, const std::string& why)> abort;
  };

  JobWatch(boost::asio::io_context& io, const LaunchOptions& options,
           Console& console, Hooks hooks);
  void Start();
  void Stop();
  // The job restarted: ranks named hung before are not any more (the
  // report keeps what was said).
  void NewGeneration() { hung_now_.clear(); }
  // One look at the board at `now` (base::SteadySeconds); Start calls it each
  // second. Public for tests.
  void Check(double now);

  // rank -> what was said about its hang, for the report.
  const std::map<int, std::string>& hangs() const { return hangs_; }
  const std::set<int>& stragglers() const { return straggler_named_; }

 private:
  void Arm();
  void CheckHangs(double now);
  void CheckStragglers();
  std::string Who(int rank) const;

  boost::asio::steady_timer timer_;
  const LaunchOptions& options_;
  Console& console_;
  Hooks hooks_;
  bool running_ = false;
  double last_check_ = 0;
  std::map<int, std::string> hangs_;
  std::set<int> hung_now_;
  std::set<int> straggler_named_;
};

}  // namespace dslaunch::launcher
