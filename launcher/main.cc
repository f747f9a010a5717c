// dslaunch: starts and supervises one multi-node training job.
//   dslaunch [options] [--] PROGRAM [ARGS...]
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>
#include <sys/prctl.h>  // PR_SET_DUMPABLE
#include <unistd.h>     // environ

#include <algorithm>  // max
#include <cstdio>
#include <cstdlib>

#include "base/exit_status.h"
#include "base/host_info.h"
#include "launcher/doctor.h"
#include "launcher/flags.h"
#include "launcher/launcher.h"
#include "launcher/plan/hostfile.h"
#include "launcher/plan/job_hosts.h"
#include "launcher/plan/plan.h"
#include "launcher/plan/rank_command.h"
#include "launcher/start/start_mode.h"
#include "proto/auth.h"  // ReadSecretFile

namespace dsl = dslaunch::launcher;

static std::string Getenv(const char* name) {
  const char* value = std::getenv(name);
  return value ? value : "";
}

// sysexits: 64 usage, 65 data.
static int ExitFor(const dslaunch::Status& st) {
  std::fprintf(stderr, "dslaunch: %s\n", st.message().c_str());
  return dslaunch::ExitStatusFor(st);
}

int main(int argc, char** argv) {
  ::prctl(PR_SET_DUMPABLE, 0);  // no rank may read our memory or secret
  dslaunch::base::EnsureStandardDescriptors();
  int exit_now = -1;
  auto options = dsl::ParseFlags(argc, argv, &exit_now);
  if (!options.ok()) return ExitFor(options.status());
  if (exit_now >= 0) return exit_now;
  auto logger = spdlog::stderr_color_mt("launcher");
  logger->set_pattern("[%H:%M:%S.%e launcher %^%l%$] %v");
  spdlog::set_default_logger(logger);
  spdlog::set_level(spdlog::level::from_str(options->log_level));

  std::string secret;
  dslaunch::StatusOr<dsl::Plan> plan = dsl::Plan{};
  if (dsl::StartModeNamed(options->launcher).agents_join) {
    // Until the agents join: "join-N" hosts, --num_gpus (else 1) ranks each.
    auto read = dslaunch::proto::ReadSecretFile(options->secret_file);
    if (!read.ok()) return ExitFor(read.status());
    secret = std::move(read).value();
    for (const std::string& w :
         dslaunch::proto::SecretFileWarnings(options->secret_file, secret))
      spdlog::warn("{}", w);
    std::vector<std::string> hosts;
    for (int n = 0; n < options->plan.num_nodes; ++n)
      hosts.push_back("join-" + std::to_string(n));
    plan = dsl::JoinPlan(
        hosts,
        std::vector<int>(hosts.size(), std::max(options->plan.num_gpus, 1)),
        options->plan);
  } else {
    const dsl::StartMode& mode = dsl::StartModeNamed(options->launcher);
    auto hosts = dsl::LoadJobHosts(
        {options->hostfile_given ? options->hostfile : "",
         options->plan.num_gpus, mode.allocation_hosts, options->launcher},
        [](const char* name) { return Getenv(name); });
    if (!hosts.ok()) return ExitFor(hosts.status());
    if (hosts->from_allocation) {
      options->hosts_from_slurm = true;
      if (mode.in_allocation_becomes)
        options->launcher = mode.in_allocation_becomes;
      std::string said = hosts->said;
      if (mode.over_allocation)
        said += std::string(" (") + mode.over_allocation + ")";
      std::fprintf(stderr, "dslaunch: %s\n", said.c_str());
    }
    plan = dsl::MakePlan(hosts->hostfile, options->plan);
  }
  if (!plan.ok()) return ExitFor(plan.status());
  // The doctor checks every host an agent would start on, spares too.
  if (options->doctor) return dsl::RunDoctor(*options, dsl::AgentPool(*plan));
  if (options->dry_run) {
    if (!options->master_port_given) plan->master_port = 0;  // not known yet
    std::printf("%s", dsl::FormatPlanTable(*plan).c_str());
    return 0;
  }
  auto command = dsl::MakeRankCommand(
      {options->program, options->no_python, options->module,
       options->no_local_rank, Getenv("DSLAUNCH_PYTHON"), Getenv("PATH")});
  if (!command.ok()) return ExitFor(command.status());
  dsl::JobEnvSources env_sources;
  env_sources.environ = environ;
  env_sources.export_prefixes = options->export_prefixes;
  env_sources.deepspeed_env_files =
      dsl::DeepSpeedEnvFiles(Getenv("HOME"), Getenv("DS_ENV_FILE"));
  env_sources.env_files = options->env_files;
  env_sources.env = options->env;
  auto job_env = dsl::CollectJobEnv(env_sources);
  if (!job_env.ok()) return ExitFor(job_env.status());
  dsl::Launcher launcher(std::move(options).value(), std::move(plan).value(),
                         std::move(job_env).value(), std::move(command).value(),
                         std::move(secret));
  return launcher.Run();
}
