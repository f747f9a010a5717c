// After a failure, what the operator needs to see and to attach to a bug
// report: the Python exception a rank left in TORCHELASTIC_ERROR_FILE, and
// <log_dir>/failure/ (the report, every rank's last lines, the stacks
// collected, the plan, the environment with secrets redacted). Pure
// functions and one writer; main thread.
#pragma once

#include <deque>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"
#include "launcher/plan/job_env.h"

namespace dslaunch::launcher {

// torch.distributed.elastic's @record error file ({"message": {"message":
// "RuntimeError: boom", "extraInfo": {"py_callstack": "Traceback ..."}}}, or
// "message" a plain string) as lines for the report: the exception, then
// the last `frames` lines of the traceback; control characters escaped,
// lines bounded. Empty when the file is not such JSON.
std::vector<std::string> DescribeErrorFile(std::string_view json,
                                           size_t frames = 8);

// Whether an environment variable's value must not be written down: names
// holding SECRET, TOKEN, PASSWORD, PASSWD, PASS_, CREDENTIAL, PRIVATE, AUTH
// or COOKIE, or ending in KEY, PASS or _PWD (any case; not PWD, OLDPWD).
bool IsSecretName(std::string_view name);
// "K=V" lines, values of secret names (and any value containing
// `job_secret`, when not empty) replaced by "<redacted>", and the
// credentials of URLs in other values ("https://user:<redacted>@host",
// "https://<redacted>@host").
std::string RedactedEnv(const EnvList& env, const std::string& job_secret);

struct FailureRecord {
  std::vector<std::string> report;  // the closing report, line by line
  std::string plan;                 // FormatPlanTable
  EnvList rank_env;                 // what every rank got on top
  EnvList launcher_env;             // the launcher's own environment
  std::string job_secret;           // to redact wherever it appears
  // rank -> its last lines (the Console's, not copied; null for none)
  std::map<int, const std::deque<std::string>*> last_lines;
  std::map<int, std::string> stacks;       // rank -> stacks text
  std::map<int, std::string> error_files;  // rank -> raw JSON
};

// Writes <log_dir>/failure/ (replacing what an earlier job left there; a
// `failure` that is a link or another user's directory is refused, and no
// file is written through a link):
// report.txt, plan.txt, env.txt, last-lines.txt, stacks-rank-<r>.txt,
// error-file-rank-<r>.json. Returns the directory.
StatusOr<std::string> WriteFailureBundle(const std::string& log_dir,
                                         const FailureRecord& record);

}  // namespace dslaunch::launcher
