// The closing report of a job, a function of what the job recorded: what
// ended it first, where and how (with the kernel's or Python's words on a
// failed rank), its last lines, what was stopped in consequence, the hangs
// seen, progress records dropped, and, after a failure, the <log_dir>/
// failure/ bundle. Main thread, after the job's loop ended.
#pragma once

#include <cstdint>
#include <map>
#include <string>

#include "launcher/plan/job_env.h"
#include "launcher/plan/plan.h"
#include "launcher/report/console.h"
#include "launcher/state/job_state.h"

namespace dslaunch::launcher {

// What the report reads; every map is rank -> value.
struct JobRecord {
  const JobState& state;
  const Plan& plan;
  Clock::time_point start_time;
  const std::map<int, int64_t>& malformed_progress;  // records dropped
  const std::map<int, int64_t>& dropped_progress;    // by its agent
  const std::map<int, std::string>& hangs;           // what was said
  const std::map<int, std::string>& stacks;          // collected
  const std::map<int, std::string>& oom;             // the kill's detail
  const std::map<int, std::string>& error_files;     // raw JSON
  // For the failure bundle: what every rank got, the secret to redact.
  const EnvList& rank_env;
  const std::string& secret;
  const std::string& log_dir;  // "" = no bundle
};

// Prints the report through `console` and returns the exit status.
int PrintClosingReport(const JobRecord& job, Console& console);

}  // namespace dslaunch::launcher
