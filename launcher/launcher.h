// Launcher: the top object of dslaunch. It owns the process's one
// io_context, the console, the control server, the start mode and the Job,
// wires them together, and runs the loop until the job has ended: the plan
// is made, the agents started, the job supervised, the report printed, in
// that order (each stage's folder builds on the ones before). Run() is
// called once, on the main thread; everything runs on that thread.
#pragma once

#include <boost/asio/io_context.hpp>
#include <boost/asio/signal_set.hpp>
#include <memory>
#include <string>
#include <vector>

#include "launcher/options.h"
#include "launcher/plan/job_env.h"
#include "launcher/plan/plan.h"
#include "launcher/report/console.h"
#include "launcher/report/metrics_server.h"
#include "launcher/start/starter.h"
#include "launcher/supervise/control_server.h"
#include "launcher/supervise/job.h"

namespace dslaunch::launcher {

class Launcher {
 public:
  // `job_env`: what every rank gets on top of its agent's environment.
  // `secret`: the job secret (--secret_file); empty = a random one.
  Launcher(LaunchOptions options, Plan plan, EnvList job_env,
           RankCommand command, std::string secret = "");
  ~Launcher();

  // Runs the job; returns the process exit status (ExitStatusFor(Outcome),
  // 74 when it succeeded but its logs are incomplete).
  int Run();

 private:
  void WatchSignals();
  // --metrics_port: the Prometheus endpoint on `addrs`.
  Status StartMetrics(const std::vector<std::string>& addrs);

  LaunchOptions options_;
  std::string job_id_;
  boost::asio::io_context io_;
  Console console_;
  // server_ before job_: the job's store answers parked requests through
  // the server when it is destroyed.
  ControlServer server_;
  Job job_;
  std::unique_ptr<Starter> starter_;
  boost::asio::signal_set signals_;
  // Renders from console_: declared after it, destroyed first.
  std::unique_ptr<MetricsServer> metrics_;
};

}  // namespace dslaunch::launcher
