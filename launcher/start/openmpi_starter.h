// OpenMpiStarter (--launcher openmpi): OpenMPI's mpirun starts the job over
// the plan's hosts (a hostfile it is given, with each node's slot count), or
// over the SLURM allocation when dslaunch runs inside one (mpirun then
// starts its daemons with srun, --overlap added):
//   mpirun --np WORLD --hostfile PLAN --map-by slot --bind-to none
//          -x DSLAUNCH_MPI_KEY [--allow-run-as-root] [--launcher_args]
//          dsagent --connect ... --from_mpirun --node_slots S1,..,SN
//                  --mpi_key_env DSLAUNCH_MPI_KEY --secret_stdout
// One process per rank, node by node: on each node local rank 0 is the
// node's agent, the others hand it their MPI identity (agent/mpi_ranks.h),
// so a rank's MPI_Init sees MPI rank == RANK and size == WORLD_SIZE. Each
// agent makes its node's secret and prints it on stdout, which mpirun
// relays to us alone; mpirun gives stdin to one process only. What stays in
// mpirun's environment (and its daemons' and their srun's, inside SLURM)
// for the whole job is the MPI key: it lets a node's MPI processes find and
// prove themselves to their agent during start, and opens nothing after it
// (each agent stops listening once its node's processes registered, before
// it starts a rank) nor ever to us (we accept only the agents' secrets).
// What mpirun says about a process that ended ("mpirun noticed that process
// rank 3 ... exited on signal 9") names the node; once the job is stopping,
// mpirun's own reports of the teardown go to the log only. A restarting job
// (--max_restarts) runs each generation in a new mpirun over every node
// (StartAgain), with a new hostfile and MPI key; what an ended generation's
// mpirun still says then goes to the log too. Owned by the Launcher;
// io_context thread only.
#pragma once

#include <sys/types.h>

#include <boost/asio/io_context.hpp>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "base/process_set.h"
#include "launcher/start/node_exits.h"
#include "launcher/start/starter.h"

namespace dslaunch::launcher {

struct MpirunSettings {
  std::string mpirun = "mpirun";
  std::vector<std::string> extra_args;  // --launcher_args, before the agent
  bool as_root = false;                 // adds --allow-run-as-root
};

// The variable in which mpirun hands every process the MPI key
// (dsagent --mpi_key_env), which each erases once read.
inline constexpr const char* kMpiKeyVariable = "DSLAUNCH_MPI_KEY";

// The hostfile mpirun is given: "HOST slots=N" per node, in plan order.
std::string MpirunHostfile(const std::vector<std::string>& hosts,
                           const std::vector<int>& slots);
// The mpirun command line that starts `agent_argv` once per rank.
std::vector<std::string> MpirunArgv(const MpirunSettings& settings,
                                    const std::string& hostfile_path,
                                    const std::vector<int>& slots,
                                    std::vector<std::string> agent_argv);
// --launcher_args mpirun cannot take from us: --output-filename (and
// OpenMPI 5's --output), which would take the agents' secrets away from
// mpirun's output, their one way to us.
Status CheckMpirunArgs(const MpirunSettings& settings);
// How mpirun runs `argv`: our environment plus the MPI key `mpi_key` (and,
// inside a SLURM allocation, --overlap for its daemons' srun step); nothing
// the launcher accepts as a secret.
base::ProcessSpec MpirunSpec(std::vector<std::string> argv,
                             const std::string& mpi_key,
                             bool in_slurm_allocation);
// The node (index) whose process mpirun says ended, and how; node -1 when
// the line says no such thing.
struct MpirunEvent {
  int node = -1;
  std::string how;
};
MpirunEvent ParseMpirunLine(const std::string& line,
                            const std::vector<int>& slots);

class OpenMpiStarter : public Starter, private base::ProcessSet::Delegate {
 public:
  OpenMpiStarter(boost::asio::io_context& io, Starter::Delegate* delegate,
                 MpirunSettings settings, std::vector<std::string> hosts,
                 std::vector<int> slots);
  ~OpenMpiStarter() override;  // mpirun gets SIGTERM if it still runs

  void Start(const AgentBootstrap& boot, StartDone done) override;
  // mpirun cannot end one node alone: ends the job's processes everywhere.
  void Kill(int node_rank) override;
  void Stopping() override { stopping_ = true; }
  bool SeesAgentProcesses() const override { return false; }
  bool AgentsMakeSecrets() const override { return true; }
  // A restarting job's next generation is a new mpirun over every node
  // (an MPI job's processes cannot start ranks twice): it starts once every
  // node's agent is asked for again and the last mpirun has ended, with a
  // new hostfile and MPI key.
  bool CanStartAgain() const override { return true; }
  void StartAgain(int node_rank) override;

 private:
  Status StartMpirun(const AgentBootstrap& boot);
  // The new mpirun, when every node waits for it and the last one ended.
  void MaybeStartAgain();
  void OnProcessOutput(pid_t pid, bool is_stderr, std::string line,
                       bool partial) override;
  void OnProcessExited(pid_t pid, const base::ExitInfo& info) override;

  boost::asio::io_context& io_;
  Starter::Delegate* delegate_;
  MpirunSettings settings_;
  std::vector<std::string> hosts_;
  std::vector<int> slots_;
  NodeExits exits_;
  std::string hostfile_path_;
  pid_t pid_ = -1;
  bool stopping_ = false;
  AgentBootstrap boot_;  // for StartAgain
  std::set<int> again_;  // nodes whose agents are asked for again
  Started started_;
  base::ProcessSet processes_;
  std::shared_ptr<bool> alive_ = std::make_shared<bool>(true);
};

}  // namespace dslaunch::launcher
