#include "agent/startup.h"

#include <CLI/CLI.hpp>
#include <cstdio>
#include <optional>
#include <utility>  // pair

#include "agent/agent_args.h"
#include "agent/probe_files.h"
#include "base/host_info.h"
#include "proto/auth.h"
#include "proto/secret_line.h"

namespace dslaunch::agent {

int ParseAgentFlags(int argc, char** argv, AgentFlags* f) {
  CLI::App app("dsagent: runs one node's ranks of a dslaunch job");
  app.add_flag("--version", f->version, "print the version and exit");
  app.add_flag("--host_check", f->host_check,
               "with --version: then print this node's setup warnings, one "
               "per line (dslaunch doctor)");
  app.add_option("--connect", f->connect,
                 "launcher's control address HOST:PORT");
  app.add_option("--node_rank", f->node_rank, "this node's index in the plan");
  app.add_option("--job_id", f->job_id, "the job's id");
  app.add_option("--log_level", f->log_level,
                 "trace, debug, info, warn, error");
  app.add_option("--connect_timeout", f->connect_timeout_s,
                 "seconds to get the job from the launcher");
  app.add_flag("--announce", f->announce,
               "print the version line on stdout before reading the secret");
  app.add_option("--hosts", f->hosts, "the plan's hosts, comma-separated");
  app.add_option("--node_host", f->node_host, "this node's name in --hosts");
  app.add_option("--node_host_env", f->node_host_env,
                 "the variable holding this node's name in --hosts");
  app.add_flag("--secret_stdout", f->secret_stdout,
               "make the job secret and print it on stdout");
  app.add_flag("--from_mpirun", f->from_mpirun,
               "started by mpirun, one process per rank (see mpi_ranks.h)");
  app.add_option("--node_slots", f->node_slots,
                 "with --from_mpirun: each node's rank count, comma-separated");
  app.add_option("--mpi_key_env", f->mpi_key_env,
                 "with --from_mpirun: read the MPI key from this variable "
                 "(then erased)");
  app.add_option("--join", f->join,
                 "join the job of `dslaunch --launcher join` at HOST:PORT");
  app.add_option("--secret_file", f->secret_file,
                 "with --join: the file holding the job secret");
  app.add_option("--join_timeout", f->join_timeout_s,
                 "with --join: seconds to keep dialing (default 600)");
  app.add_option("--ready_file", f->ready_file,
                 "with --join: made once the job is joined, removed at the "
                 "end (a readiness probe)");
  app.add_option("--alive_file", f->alive_file,
                 "with --join: touched every second while the agent runs, "
                 "removed at the end (a liveness probe: --alive_check)");
  app.add_option("--alive_check", f->alive_check,
                 "exit 0 if this --alive_file was touched within "
                 "--alive_within seconds, else 1 (a liveness probe's command)");
  app.add_option("--alive_within", f->alive_within_s,
                 "with --alive_check: seconds (default 30)");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  f->node_rank_given = app.count("--node_rank") > 0;
  return -1;
}

namespace {

// --join: dial HOST:PORT until it answers, prove the secret in a file.
Status ResolveJoin(const AgentFlags& f, const Getenv& env, Startup* s) {
  AgentOptions& o = s->options;
  if (!f.connect.empty())
    return InvalidArgument("--join and --connect: give one");
  if (f.secret_file.empty()) {
    return InvalidArgument(
        "--join needs --secret_file FILE: the job secret the launcher checks");
  }
  auto secret = proto::ReadSecretFile(f.secret_file);
  if (!secret.ok()) return secret.status();
  for (std::string& w : proto::SecretFileWarnings(f.secret_file, *secret))
    s->warnings.push_back(std::move(w));
  if (Status st =
          base::SplitHostPort(f.join, &o.launcher_host, &o.launcher_port);
      !st.ok()) {
    return InvalidArgument("--join " + st.message());
  }
  if (!(f.join_timeout_s > 0 && f.join_timeout_s <= 86400))
    return InvalidArgument("--join_timeout must be in (0, 86400] seconds");
  std::optional<int> flag;
  if (f.node_rank_given) {
    if (f.node_rank < 0 || f.node_rank > 65535) {
      return InvalidArgument("--node_rank must be in 0..65535, got " +
                             std::to_string(f.node_rank));
    }
    flag = f.node_rank;
  }
  // A StatefulSet's pod is NAME-<ordinal>, from 0; other hosts' -N (dgx-1,
  // node-12) are no node ranks: the hostname counts in a pod.
  auto rank = JoinNodeRank(flag, env("JOB_COMPLETION_INDEX"),
                           env("KUBERNETES_SERVICE_HOST") != nullptr
                               ? base::LocalHostname()
                               : std::string(),
                           &o.join_rank_from);
  if (!rank.ok()) return rank.status();
  o.node_rank = *rank;
  o.secret = std::move(secret).value();
  o.join = true;
  if (!f.ready_file.empty() && f.ready_file == f.alive_file)
    return InvalidArgument("--ready_file and --alive_file name one file");
  // The pod's /tmp outlives its container: the files of an agent that was
  // killed are this one's to take over.
  for (const auto& [flag, path] : {std::pair<const char*, const std::string&>{
                                       "--ready_file", f.ready_file},
                                   {"--alive_file", f.alive_file}}) {
    if (path.empty()) continue;
    bool removed = false;
    if (Status st = ClaimProbeFile(flag, path, &removed); !st.ok()) return st;
    if (removed) {
      s->warnings.push_back(std::string(flag) + " " + path +
                            ": removed the one an earlier agent left (it "
                            "did not end cleanly)");
    }
  }
  o.ready_file = f.ready_file;
  o.alive_file = f.alive_file;
  o.stdin_is_lifeline = false;
  o.connect_timeout_s = f.join_timeout_s;
  o.job_id = "join";  // the launcher's id comes with the job
  return Status::Ok();
}

// pdsh and srun run one command on every node: the node is found in
// --hosts by its name, given or in a variable (srun: SLURMD_NODENAME).
Status ResolveNodeHost(const AgentFlags& f, const Getenv& env, Startup* s) {
  std::string node_host = f.node_host;
  if (!f.node_host_env.empty()) {
    const char* value = env(f.node_host_env.c_str());
    if (value == nullptr || *value == '\0') {
      return InvalidArgument("--node_host_env " + f.node_host_env +
                             ": not set on this node");
    }
    node_host = value;
  }
  if (node_host.empty()) return Status::Ok();
  auto rank = NodeRankInHosts(f.hosts, node_host);
  if (!rank.ok()) return rank.status();
  s->options.node_rank = *rank;
  return Status::Ok();
}

// mpirun starts one process per rank and forwards no stdin to most: local
// rank 0 becomes the node's agent (making its secret, --secret_stdout), the
// others prove to it the MPI key, which comes in a variable erased once
// read.
Status ResolveMpirun(const AgentFlags& f, const Getenv& env, Startup* s) {
  if (!f.from_mpirun) {
    if (!f.mpi_key_env.empty())
      return InvalidArgument("--mpi_key_env goes with --from_mpirun");
    return Status::Ok();
  }
  if (f.mpi_key_env.empty())
    return InvalidArgument("--from_mpirun needs --mpi_key_env");
  auto key = TakeVariable(f.mpi_key_env);  // wiped
  if (!key.ok()) return key.status();
  auto slots = ParseNodeSlots(f.node_slots);
  if (!slots.ok()) return slots.status();
  auto placement = MpiPlacementFrom(env, *slots);
  if (!placement.ok()) return placement.status();
  s->options.node_rank = placement->node_rank;
  if (placement->local_rank > 0) {
    s->kind = Startup::Kind::kMpiHolder;
    s->placement = *placement;
    s->mpi_key = std::move(key).value();
    return Status::Ok();
  }
  if (!f.secret_stdout)
    return InvalidArgument("--from_mpirun needs --secret_stdout");
  s->options.mpi = *placement;
  s->options.mpi_key = std::move(key).value();
  return Status::Ok();
}

bool ValidJobId(const std::string& id) {
  return !id.empty() && id.size() <= 64 &&
         id.find_first_not_of(
             "ABCDEFGHIJKLMNOPQRSTUVWXYZ"
             "abcdefghijklmnopqrstuvwxyz"
             "0123456789_-") == std::string::npos;
}

}  // namespace

StatusOr<Startup> ResolveStartup(const AgentFlags& f, const Getenv& env) {
  Startup s;
  AgentOptions& o = s.options;
  o.node_rank = f.node_rank;
  o.job_id = f.job_id;
  o.connect_timeout_s = f.connect_timeout_s;
  s.secret_stdout = f.secret_stdout;
  if (f.join.empty() && f.connect.empty() &&
      env("KUBERNETES_SERVICE_HOST") != nullptr) {
    return InvalidArgument(
        "in a Kubernetes pod, run dsagent --join LAUNCHER_HOST:PORT "
        "--secret_file FILE (and dslaunch --launcher join in the launcher's "
        "pod); see docs/kubernetes.md");
  }
  if (!f.join.empty()) {
    if (Status st = ResolveJoin(f, env, &s); !st.ok()) return st;
  } else if (!f.secret_file.empty() || !f.ready_file.empty() ||
             !f.alive_file.empty()) {
    return InvalidArgument(
        "--secret_file, --ready_file and --alive_file go with --join");
  }
  if (Status st = ResolveNodeHost(f, env, &s); !st.ok()) return st;
  if (!ValidJobId(o.job_id)) {
    return InvalidArgument(
        "--job_id: 1 to 64 letters, digits, '_' or '-' are required");
  }
  if (Status st = ResolveMpirun(f, env, &s); !st.ok()) return st;
  if (s.kind == Startup::Kind::kMpiHolder) return s;
  if (!o.join) {
    if (Status st = ParseConnect(f.connect, &o.launcher_host, &o.launcher_port);
        !st.ok()) {
      return st;
    }
  }
  return s;
}

bool TakeSecret(Startup* s) {
  AgentOptions& o = s->options;
  if (s->secret_stdout) {
    o.secret = proto::HexEncode(proto::RandomBytes(32));
    std::printf("%s\n", proto::SecretLine(o.node_rank, o.secret).c_str());
    std::fflush(stdout);
    o.stdin_is_lifeline = false;
    return true;
  }
  if (!o.secret.empty()) return true;  // --join's file
  return ReadSecretLine(0, &o.secret) && !o.secret.empty();
}

}  // namespace dslaunch::agent
