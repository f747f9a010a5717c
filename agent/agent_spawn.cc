// How the agent starts a generation's ranks: the run directory with the
// store's and each rank's progress socket, the ranks' working directory,
// cores, environment and MPI identity, each rank spawned through Ranks and
// announced; a rank that cannot start is reported with the reason. Part of
// Agent (agent/agent.h); io_context thread only.
#include <limits.h>  // PATH_MAX
#include <spdlog/spdlog.h>
#include <stdlib.h>    // getenv
#include <sys/stat.h>  // stat
#include <unistd.h>    // environ, getcwd

#include <cerrno>
#include <cstring>
#include <filesystem>

#include "agent/agent.h"
#include "agent/env_contract.h"
#include "agent/node_facts.h"  // InterfaceToward
#include "agent/run_dirs.h"
#include "base/exit_status.h"
#include "base/host_info.h"  // UsableCores
#include "base/unix_time.h"

namespace dslaunch::agent {

namespace {

// dslaunch's Python files next to this dsagent: <its directory>/../share/
// dslaunch/python, the build tree's layout and an install's; "" when they
// are not there.
std::string PythonDir() {
  char exe[PATH_MAX];
  const ssize_t n = ::readlink("/proc/self/exe", exe, sizeof(exe) - 1);
  if (n <= 0) return "";
  const std::filesystem::path bin =
      std::filesystem::path(std::string(exe, static_cast<size_t>(n)))
          .parent_path();
  std::error_code ec;
  const std::filesystem::path dir = std::filesystem::canonical(
      bin.parent_path() / "share" / "dslaunch" / "python", ec);
  if (ec ||
      ::access((dir / "dslaunch_hook" / "sitecustomize.py").c_str(), R_OK) != 0)
    return "";
  return dir.string();
}

}  // namespace

void Agent::RemoveRunDir() {
  if (run_dir_.empty()) return;
  std::error_code ec;
  std::filesystem::remove_all(run_dir_, ec);
  run_dir_.clear();
}

void Agent::StartWorkers() {
  if (Status st = SpawnWorkers(); !st.ok()) return FailSpawn(st);
  SetState(State::kRunning);
}

void Agent::FailSpawn(const Status& st) {
  spdlog::error("cannot start workers: {}", st.message());
  exit_code_ = kExitSoftware;
  // The launcher learns why: every rank not started "exits" 70 with it.
  for (const auto& r : job_.ranks()) {
    if (spawned_.count(r.rank())) continue;
    wire::Envelope env;
    auto* exited = env.mutable_worker_exited();
    exited->set_rank(r.rank());
    exited->set_exit_code(70);
    exited->set_error("the agent could not start it: " + st.message());
    exited->set_time(base::UnixSeconds());
    Send(env);
  }
  Drain(true, st.message());
}

Status Agent::SetUpRunDir() {
  const char* tmp = std::getenv("TMPDIR");
  std::string parent = tmp && *tmp && std::strlen(tmp) < 60 ? tmp : "/tmp";
  // What an agent of this job killed before its end left (this node's, or
  // this pod's last container's).
  if (const int n = RemoveDeadAgentsRunDirs(parent, job_.job_id()); n > 0)
    spdlog::info("removed {} run director{} of agents gone", n,
                 n == 1 ? "y" : "ies");
  ASSIGN_OR_RETURN(run_dir_, MakeRunDir(parent, job_.job_id()));
  RETURN_IF_ERROR(store_.Listen(run_dir_ + "/store.sock"));
  RETURN_IF_ERROR(horovod_.Listen());
  horovod_.SetScopes(HorovodScopes(job_));
  for (const auto& r : job_.ranks()) {
    RETURN_IF_ERROR(progress_.Listen(
        r.rank(), run_dir_ + "/p" + std::to_string(r.rank()) + ".sock"));
  }
  return Status::Ok();
}

// The launcher's working directory where this node has it (a shared
// filesystem), else ours (under ssh: the home directory), as DeepSpeed's
// `cd DIR; python ...` does; said once.
std::string Agent::RankDirectory() const {
  struct stat st;
  if (job_.cwd().empty() ||
      (::stat(job_.cwd().c_str(), &st) == 0 && S_ISDIR(st.st_mode)))
    return job_.cwd();
  char here[PATH_MAX] = {0};
  spdlog::warn("{} does not exist on {}: ranks start in {}", job_.cwd(),
               job_.host(), ::getcwd(here, sizeof(here)) ? here : "?");
  return "";
}

Status Agent::SpawnWorkers() {
  workers_->Contain(job_.job_id(), options_.node_rank);
  const std::string cwd = RankDirectory();
  std::vector<std::vector<int>> cores;
  if (job_.bind_cores_to_rank()) {
    std::vector<int> list(job_.bind_core_list().begin(),
                          job_.bind_core_list().end());
    if (list.empty()) list = base::UsableCores();
    ASSIGN_OR_RETURN(cores, ShareCores(list, job_.ranks_size()));
  }
  const std::string socket_ifname = InterfaceToward(job_.master_addr());
  if (!socket_ifname.empty())
    spdlog::info("interface toward MASTER_ADDR {}: {}", job_.master_addr(),
                 socket_ifname);
  const std::string python_dir =
      job_.no_progress_hook() ? std::string() : PythonDir();
  for (const auto& r : job_.ranks()) {
    const std::string rank = std::to_string(r.rank());
    RankPaths paths{
        .progress_socket = run_dir_ + "/p" + rank + ".sock",
        .store_address = "unix:" + run_dir_ + "/store.sock",
        .error_file = run_dir_ + "/error-" + rank + ".json",
        .socket_ifname = socket_ifname,
        .python_dir = python_dir,
        .horovod_port = horovod_.port(),
    };
    std::vector<std::string> mpi_vars;
    if (mpi_) {
      const int world = mpi_->WorldRankOf(r.local_rank());
      if (world != r.rank()) {
        return InvalidArgument("mpirun's process for local rank " +
                               std::to_string(r.local_rank()) +
                               " is MPI rank " + std::to_string(world) +
                               ", the plan's rank is " + rank);
      }
      mpi_vars = r.local_rank() == 0 ? MpiVariables(environ)
                                     : mpi_->VariablesOf(r.local_rank());
    }
    WorkerSpec spec{
        .rank = r.rank(),
        .argv = BuildRankArgv(job_, r),
        .env =
            BuildRankEnv(job_, r, paths, environ, mpi_ ? &mpi_vars : nullptr),
        .cwd = cwd,
        .cpus = {},
        .tracer = monitor_.StackTracer(),  // never the agent (stack_helper.h)
    };
    if (!cores.empty()) {
      // DeepSpeed gives a bound rank as many OpenMP threads as cores.
      spec.cpus = cores[static_cast<size_t>(r.local_rank())];
      std::erase_if(spec.env, [](const std::string& kv) {
        return kv.rfind("OMP_NUM_THREADS=", 0) == 0;
      });
      spec.env.push_back("OMP_NUM_THREADS=" + std::to_string(spec.cpus.size()));
    }
    ASSIGN_OR_RETURN(pid_t pid, workers_->Spawn(spec));
    spawned_.insert(r.rank());
    monitor_.OnStarted(r.rank(), pid, paths.error_file, workers_->cgroup_dir());
    wire::Envelope env;
    auto* started = env.mutable_worker_started();
    started->set_rank(r.rank());
    started->set_pid(pid);
    started->set_time(base::UnixSeconds());
    Send(env);
  }
  workers_->GuardContainment();
  return Status::Ok();
}

}  // namespace dslaunch::agent
