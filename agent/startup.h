// dsagent's start-up: its command line and what each way of being started
// makes of it, before the Agent runs. The launcher starts agents five ways:
//   --connect HOST:PORT, the secret on stdin         (local, ssh)
//   --hosts/--node_host(_env) --secret_stdout        (pdsh, srun: one
//       command on every node; the agent makes its node's secret and
//       prints it for the launcher)
//   --from_mpirun --node_slots --mpi_key_env         (mpirun: one process
//       per rank; local rank 0 becomes the agent, the others hold their MPI
//       identity for it, see mpi_ranks.h)
//   --join HOST:PORT --secret_file FILE              (join: started by
//       someone else, e.g. a worker pod)
// The secret never comes from argv or an environment.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "agent/agent.h"
#include "agent/mpi_ranks.h"
#include "base/status.h"

namespace dslaunch::agent {

// The command line as given.
struct AgentFlags {
  bool version = false;
  bool host_check = false;  // with --version: print this node's warnings
  std::string connect;
  std::string log_level = "warn";
  int node_rank = 0;
  bool node_rank_given = false;
  std::string job_id;
  double connect_timeout_s = 30;
  bool announce = false;  // the version line on stdout first
  std::string hosts, node_host, node_host_env;
  bool secret_stdout = false;
  bool from_mpirun = false;
  std::string node_slots, mpi_key_env;
  std::string join, secret_file, ready_file, alive_file;
  double join_timeout_s = 600;
  std::string alive_check;  // a liveness probe: is this file fresh?
  double alive_within_s = 30;
};

// Parses argv into *flags: -1 to go on, else the exit status (0 after
// --help; CLI11's for a flag it cannot parse, with its message printed).
int ParseAgentFlags(int argc, char** argv, AgentFlags* flags);

// What this process is to do.
struct Startup {
  enum class Kind {
    kAgent,      // run the node's Agent with `options`
    kMpiHolder,  // hold an MPI rank's identity for the node's agent
  };
  Kind kind = Kind::kAgent;
  AgentOptions options;  // the secret still to be taken (TakeSecret)
  bool secret_stdout = false;
  MpiPlacement placement;             // kMpiHolder: this process's place
  std::string mpi_key;                // kMpiHolder: what it proves to the agent
  std::vector<std::string> warnings;  // to log once logging is set up
};

using Getenv = std::function<const char*(const char*)>;

// The start-up the flags ask for, checked: InvalidArgument naming the flag
// (exit 64) for a combination that cannot work. Reads --secret_file and
// takes (and wipes) the MPI key's variable; `env` answers every other
// variable lookup (KUBERNETES_SERVICE_HOST, JOB_COMPLETION_INDEX,
// --node_host_env's, mpirun's).
StatusOr<Startup> ResolveStartup(const AgentFlags& flags, const Getenv& env);

// The node's secret: made here and printed on stdout as the secret line
// (--secret_stdout), else the join file's (already read), else one line on
// stdin. False when none came.
bool TakeSecret(Startup* startup);

}  // namespace dslaunch::agent
