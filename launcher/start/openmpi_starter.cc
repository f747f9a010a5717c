#include "launcher/start/openmpi_starter.h"

#include <signal.h>  // SIGTERM
#include <spdlog/spdlog.h>
#include <stdlib.h>  // mkstemp, getenv
#include <unistd.h>  // geteuid, unlink, close

#include "base/unix_socket.h"                // WriteAll
#include "launcher/plan/slurm_allocation.h"  // InSlurmAllocation
#include "launcher/start/secret_relay.h"
#include "proto/auth.h"  // RandomBytes

namespace dslaunch::launcher {

namespace asio = boost::asio;

std::string MpirunHostfile(const std::vector<std::string>& hosts,
                           const std::vector<int>& slots) {
  std::string out = "# dslaunch's plan for mpirun: node by node\n";
  for (size_t i = 0; i < hosts.size(); ++i)
    out += hosts[i] + " slots=" + std::to_string(slots.at(i)) + "\n";
  return out;
}

std::vector<std::string> MpirunArgv(const MpirunSettings& s,
                                    const std::string& hostfile_path,
                                    const std::vector<int>& slots,
                                    std::vector<std::string> agent_argv) {
  int world = 0;
  std::string slot_list;
  for (int n : slots) {
    world += n;
    slot_list += (slot_list.empty() ? "" : ",") + std::to_string(n);
  }
  std::vector<std::string> argv = {
      s.mpirun,     "--np",         std::to_string(world),
      "--hostfile", hostfile_path,  "--map-by",
      "slot",       "--bind-to",    "none",
      "-x",         kMpiKeyVariable};
  if (s.as_root) argv.push_back("--allow-run-as-root");
  argv.insert(argv.end(), s.extra_args.begin(), s.extra_args.end());
  // One command for every process: each finds its place from mpirun's
  // variables.
  for (size_t i = 0; i + 1 < agent_argv.size(); ++i) {
    if (agent_argv[i] == "--node_rank")
      agent_argv.erase(agent_argv.begin() + i, agent_argv.begin() + i + 2);
  }
  agent_argv.insert(agent_argv.end(),
                    {"--from_mpirun", "--node_slots", slot_list,
                     "--mpi_key_env", kMpiKeyVariable, "--secret_stdout"});
  argv.insert(argv.end(), agent_argv.begin(), agent_argv.end());
  return argv;
}

Status CheckMpirunArgs(const MpirunSettings& s) {
  for (const auto& word : s.extra_args) {
    std::string_view name(word);
    while (!name.empty() && name.front() == '-') name.remove_prefix(1);
    name = name.substr(0, name.find('='));
    if (name.rfind("output-filename", 0) == 0 || name == "output") {
      return InvalidArgument("--launcher_args: mpirun's " + word +
                             " is not accepted: the agents hand dslaunch "
                             "their secrets on mpirun's output");
    }
  }
  return Status::Ok();
}

base::ProcessSpec MpirunSpec(std::vector<std::string> argv,
                             const std::string& mpi_key,
                             bool in_slurm_allocation) {
  base::ProcessSpec spec;
  spec.argv = std::move(argv);
  spec.inherit_env = true;  // mpirun reads a SLURM allocation from it
  spec.env.push_back(std::string(kMpiKeyVariable) + "=" + mpi_key);
  // Inside an allocation mpirun starts its daemons with srun; the step must
  // share the allocation's resources with whatever else runs in it.
  if (in_slurm_allocation)
    spec.env.push_back("OMPI_MCA_plm_slurm_args=--overlap");
  spec.new_session = true;
  spec.death_signal = SIGTERM;
  spec.destroy_signal = SIGTERM;
  return spec;
}

MpirunEvent ParseMpirunLine(const std::string& line,
                            const std::vector<int>& slots) {
  // mpirun noticed that process rank 3 with PID 0 on node n1 exited on
  // signal 9 (Killed). (The tool names itself: mpiexec, orterun, ...)
  MpirunEvent e;
  static const std::string kNoticed = " noticed that process rank ";
  const size_t at = line.find(kNoticed);
  if (at == std::string::npos) return e;
  size_t pos = at + kNoticed.size();
  long rank = 0;
  size_t digits = 0;
  while (pos < line.size() &&
         std::isdigit(static_cast<unsigned char>(line[pos])) && digits < 9) {
    rank = rank * 10 + (line[pos++] - '0');
    ++digits;
  }
  if (digits == 0 || (pos < line.size() &&
                      std::isdigit(static_cast<unsigned char>(line[pos]))))
    return e;
  const size_t how = line.find(" exited ", pos);
  if (how == std::string::npos) return e;
  long first = 0;
  for (size_t i = 0; i < slots.size(); ++i) {
    if (rank < first + slots[i]) {
      e.node = static_cast<int>(i);
      e.how =
          "mpirun's process of rank " + std::to_string(rank) + line.substr(how);
      while (!e.how.empty() && e.how.back() == '.') e.how.pop_back();
      return e;
    }
    first += slots[i];
  }
  return e;
}

OpenMpiStarter::OpenMpiStarter(asio::io_context& io,
                               Starter::Delegate* delegate,
                               MpirunSettings settings,
                               std::vector<std::string> hosts,
                               std::vector<int> slots)
    : io_(io),
      delegate_(delegate),
      settings_(std::move(settings)),
      hosts_(std::move(hosts)),
      slots_(std::move(slots)),
      exits_(delegate, "mpirun"),
      processes_(io, this) {}

// processes_ sends mpirun SIGTERM (ProcessSpec::destroy_signal): it ends
// the job's processes on every node and its daemons.
OpenMpiStarter::~OpenMpiStarter() {
  *alive_ = false;
  if (!hostfile_path_.empty()) ::unlink(hostfile_path_.c_str());
}

std::unique_ptr<Starter> NewOpenMpiStarter(const StarterContext& context) {
  std::vector<std::string> hosts;
  std::vector<int> slots;
  for (const auto& node : context.plan.nodes) {
    hosts.push_back(node.host);
    slots.push_back(static_cast<int>(node.slots.size()));
  }
  MpirunSettings settings;
  settings.extra_args = context.options.launcher_words;
  settings.as_root = ::geteuid() == 0;
  return std::make_unique<OpenMpiStarter>(context.io, context.delegate,
                                          std::move(settings), std::move(hosts),
                                          std::move(slots));
}

void OpenMpiStarter::Start(const AgentBootstrap& boot, StartDone done) {
  boot_ = boot;
  Status st = StartMpirun(boot);
  PostStartDone(io_, alive_, st, started_, std::move(done));
}

void OpenMpiStarter::StartAgain(int node_rank) {
  again_.insert(node_rank);
  MaybeStartAgain();
}

void OpenMpiStarter::MaybeStartAgain() {
  if (again_.size() < hosts_.size() || pid_ > 0 || stopping_) return;
  again_.clear();
  Status st = StartMpirun(boot_);
  if (st.ok()) return;
  for (size_t n = 0; n < hosts_.size(); ++n) {
    delegate_->OnAgentProcessExited(static_cast<int>(n),
                                    "could not be started: " + st.message());
  }
}

Status OpenMpiStarter::StartMpirun(const AgentBootstrap& boot) {
  RETURN_IF_ERROR(CheckMpirunArgs(settings_));
  // The agents dial back our address on the route to node 0, as under SLURM.
  ASSIGN_OR_RETURN(base::Route route, RouteToNode0(hosts_.at(0)));
  started_.master_addr = route.peer;
  if (!hostfile_path_.empty()) ::unlink(hostfile_path_.c_str());  // the last
  hostfile_path_.clear();
  const char* tmp = std::getenv("TMPDIR");
  std::string path =
      std::string(tmp && *tmp ? tmp : "/tmp") + "/dslaunch-mpirun-hosts-XXXXXX";
  const int fd = ::mkstemp(path.data());
  if (fd < 0)
    return ErrnoStatus("cannot create mpirun's hostfile " + path, errno);
  hostfile_path_ = path;
  Status written = base::WriteAll(fd, MpirunHostfile(hosts_, slots_));
  ::close(fd);
  RETURN_IF_ERROR(written);
  const EnvLookup env = [](const char* name) {
    const char* v = std::getenv(name);
    return std::string(v ? v : "");
  };
  StatusOr<pid_t> pid = processes_.Spawn(MpirunSpec(
      MpirunArgv(settings_, hostfile_path_, slots_,
                 AgentArgv(boot, 0, route.local)),
      proto::HexEncode(proto::RandomBytes(proto::kSecretBytes)),
      InSlurmAllocation(env) && env("OMPI_MCA_plm_slurm_args").empty()));
  if (!pid.ok())
    return Unavailable("cannot start mpirun: " + pid.status().message());
  pid_ = *pid;
  exits_.StartedAll(pid_, hosts_.size());
  return Status::Ok();
}

void OpenMpiStarter::OnProcessOutput(pid_t pid, bool, std::string line, bool) {
  if (RelaySecretLine(delegate_, "mpirun", line, hosts_.size())) return;
  const MpirunEvent e = ParseMpirunLine(line, slots_);
  // Once the job stops, or a new mpirun is wanted or took over (a restart),
  // what an mpirun says is its teardown.
  if (stopping_ || pid != pid_ || !again_.empty()) {
    spdlog::info("[mpirun] {}", line);
  } else {
    delegate_->OnStarterOutput("mpirun", line);
  }
  exits_.Ended(pid, e.node, e.how);
}

void OpenMpiStarter::OnProcessExited(pid_t pid, const base::ExitInfo& info) {
  pid_ = -1;
  exits_.ToolEnded(pid, info);
  MaybeStartAgain();
}

void OpenMpiStarter::Kill(int) {
  if (pid_ > 0) processes_.Signal(pid_, SIGTERM);
}

}  // namespace dslaunch::launcher
