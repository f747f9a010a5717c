#include "agent/stack_collector.h"

#include <limits.h>  // PATH_MAX
#include <signal.h>  // SIGKILL, SIGCONT
#include <spdlog/spdlog.h>
#include <sys/stat.h>  // stat
#include <unistd.h>    // readlink, access

#include <algorithm>
#include <boost/asio/steady_timer.hpp>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace dslaunch::agent {

namespace asio = boost::asio;

namespace {

constexpr size_t kMarkerRoom = 128;     // for the "dropped" marker line
constexpr size_t kMaxStderrTail = 512;  // of a failing tool, for the error

// The state letter of /proc/<pid>/stat ('R', 'S', 'T', ...), or 0.
char ProcessState(pid_t pid) {
  std::FILE* f =
      std::fopen(("/proc/" + std::to_string(pid) + "/stat").c_str(), "re");
  if (f == nullptr) return 0;
  char buf[512];
  const size_t n = std::fread(buf, 1, sizeof(buf) - 1, f);
  std::fclose(f);
  buf[n] = '\0';
  const char* paren = std::strrchr(buf, ')');
  return paren != nullptr && paren[1] == ' ' ? paren[2] : 0;
}

// A hint when tracing was refused and Yama is why: with ptrace_scope 1 only
// a process's ancestors and its declared tracer's descendants may trace it
// (a rank declares the stack helper that runs these tools: stack_helper.h);
// with 2 only root, with 3 nobody.
std::string PtraceHint(const std::string& failures) {
  if (failures.find("not permitted") == std::string::npos) return "";
  std::FILE* f = std::fopen("/proc/sys/kernel/yama/ptrace_scope", "re");
  if (f == nullptr) return "";
  int scope = 0;
  const bool read = std::fscanf(f, "%d", &scope) == 1;
  std::fclose(f);
  if (!read || scope < 1) return "";
  const std::string is =
      " (kernel.yama.ptrace_scope is " + std::to_string(scope) + ": ";
  if (scope == 1) {
    return is +
           "a rank may be traced only by the stack helper it named at its "
           "start; did it name another tracer itself?)";
  }
  return is + (scope == 2 ? "only root may trace: run the agent as root)"
                          : "no process may trace)");
}

std::string DefaultPath() {
  const char* path = std::getenv("PATH");
  return path != nullptr && *path ? path : "/usr/local/bin:/usr/bin:/bin";
}

}  // namespace

struct StackCollector::Job {
  explicit Job(asio::io_context& io) : timer(io) {}
  int rank = 0;
  pid_t pid = -1;
  std::vector<StackTool> tools;
  size_t next = 0;  // the tool to try next
  // The tool now running (tools[next - 1]) and what it said so far.
  pid_t tool_pid = -1;
  std::string text;
  size_t dropped = 0;
  std::string stderr_tail;
  bool timed_out = false;
  asio::steady_timer timer;  // at `deadline`: the running tool is killed
  std::chrono::steady_clock::time_point deadline;
  bool rank_exited = false;
  // Outcome.
  std::vector<std::string> failures;
  std::string result_tool, result_text;
  bool ok = false;
};

// Why a tool run did not give stacks, "" when it did.
static std::string ToolFailure(const StackCollector::Job& job,
                               const base::ExitInfo& info,
                               std::chrono::milliseconds timeout) {
  std::string why;
  if (job.timed_out) {
    char secs[32];
    std::snprintf(secs, sizeof(secs), "%g", timeout.count() / 1000.0);
    why = std::string("stopped: the ") + secs +
          " s for this rank's stacks ran out";
  } else if (!info.error.empty()) {
    why = info.error;
  } else if (info.signal != 0) {
    why = "killed by signal " + std::to_string(info.signal);
  } else if (info.exit_code != 0) {
    why = "exit status " + std::to_string(info.exit_code);
  } else if (job.text.empty()) {
    why = "no output";
  } else {
    return "";
  }
  const std::string& name = job.tools[job.next - 1].name;
  return name + ": " + why +
         (job.stderr_tail.empty() ? "" : " (" + job.stderr_tail + ")");
}

bool IsPythonProcess(pid_t pid) {
  char target[PATH_MAX];
  const std::string link = "/proc/" + std::to_string(pid) + "/exe";
  const ssize_t n = ::readlink(link.c_str(), target, sizeof(target) - 1);
  if (n <= 0) return false;
  std::string exe(target, static_cast<size_t>(n));
  exe = exe.substr(exe.rfind('/') + 1);
  return exe.rfind("python", 0) == 0;
}

Status TrustedTool(const std::string& path) {
  char real[PATH_MAX];
  if (::realpath(path.c_str(), real) == nullptr)
    return ErrnoStatus(path, errno);
  std::string at = real;
  struct stat st {};
  if (::stat(at.c_str(), &st) != 0) return ErrnoStatus(at, errno);
  if (!S_ISREG(st.st_mode) || st.st_uid != 0 || (st.st_mode & 022)) {
    return InvalidArgument(
        at + " is not a root-owned file that only root can write");
  }
  // Every directory above it: root's, and writable by no one else unless
  // sticky (/tmp: nobody else can replace root's entries there).
  while (at.size() > 1) {
    at.resize(std::max<size_t>(at.rfind('/'), 1));
    if (::stat(at.c_str(), &st) != 0) return ErrnoStatus(at, errno);
    if (st.st_uid != 0 || ((st.st_mode & 022) && !(st.st_mode & S_ISVTX))) {
      return InvalidArgument(real + std::string(": its directory ") + at +
                             " is not root's alone");
    }
  }
  return Status::Ok();
}

std::vector<StackTool> StackToolsFor(pid_t pid, bool is_python,
                                     const std::string& path_env) {
  const std::string id = std::to_string(pid);
  std::vector<StackTool> tools;
  // The first trusted one on PATH: a rank can often write to a directory
  // there (a venv's bin, ~/.local/bin), and a program it planted would run
  // as a child of the stack helper, which every rank names as its tracer.
  auto add = [&](const std::string& name, std::vector<std::string> args) {
    auto path = base::ResolveProgram(name, path_env, TrustedTool);
    if (!path.ok()) return;
    args.insert(args.begin(), *path);
    tools.push_back({name, std::move(args)});
  };
  if (is_python) add("py-spy", {"dump", "--pid", id});
  add("eu-stack", {"-p", id});
  add("gdb", {"-p", id, "-batch", "-nx", "-ex", "thread apply all bt"});
  return tools;
}

StackCollector::StackCollector(asio::io_context& io, Reply reply,
                               StackToolOptions options)
    : io_(io),
      reply_(std::move(reply)),
      options_(std::move(options)),
      tools_(io, this) {
  if (options_.path_env.empty()) options_.path_env = DefaultPath();
  if (options_.max_text_bytes < 2 * kMarkerRoom)
    options_.max_text_bytes = 2 * kMarkerRoom;
  if (options_.max_running == 0) options_.max_running = 1;
}

StackCollector::~StackCollector() = default;  // tools_ SIGKILLs the tools

void StackCollector::Collect(int rank, pid_t pid) {
  if (stopped_ || by_rank_.count(rank)) return;  // merged
  wire::Stacks refused;
  refused.set_rank(rank);
  if (queue_.size() >= options_.max_queued) {
    refused.set_error("too many stack collections queued on this node");
    return reply_(refused);
  }
  auto job = std::make_shared<Job>(io_);
  job->rank = rank;
  job->pid = pid;
  job->deadline = std::chrono::steady_clock::now() + options_.timeout;
  job->tools = StackToolsFor(pid, IsPythonProcess(pid), options_.path_env);
  if (job->tools.empty()) {
    refused.set_error("no stack tool found (install elfutils or gdb)");
    return reply_(refused);
  }
  queue_.push_back(job);
  by_rank_[rank] = job;
  StartQueued();
}

void StackCollector::StartQueued() {
  while (!stopped_ && running_.size() < options_.max_running &&
         !queue_.empty()) {
    std::shared_ptr<Job> job = std::move(queue_.front());
    queue_.pop_front();
    RunNextTool(job);
  }
}

// Starts the job's next tool, or finishes the job when none is left.
void StackCollector::RunNextTool(const std::shared_ptr<Job>& job) {
  while (job->next < job->tools.size()) {
    if (job->rank_exited) {
      job->failures.push_back("the rank exited");
      break;
    }
    if (std::chrono::steady_clock::now() >= job->deadline) {
      const std::string& name = job->tools[job->next].name;
      job->failures.push_back(
          "no time left for " + name +
          " (other ranks' stacks or earlier tools took it)");
      break;
    }
    const StackTool& tool = job->tools[job->next++];
    job->text.clear();
    job->dropped = 0;
    job->stderr_tail.clear();
    job->timed_out = false;
    base::ProcessSpec spec;
    spec.argv = tool.argv;
    spec.inherit_env = true;  // as the agent's user, with its environment
    auto pid = tools_.Spawn(spec);
    if (!pid.ok()) {
      job->failures.push_back(tool.name + ": " + pid.status().message());
      continue;
    }
    job->tool_pid = *pid;
    running_[*pid] = job;
    job->timer.expires_at(job->deadline);
    job->timer.async_wait(
        [this, weak = std::weak_ptr<Job>(job),
         tool_pid = *pid](const boost::system::error_code& ec) {
          const auto j = weak.lock();
          if (ec || !j || j->tool_pid != tool_pid) return;
          j->timed_out = true;  // a stuck tool must not hold the rank stopped
          tools_.Signal(tool_pid, SIGKILL);
        });
    return;
  }
  Finish(job);
}

void StackCollector::OnProcessOutput(pid_t pid, bool is_stderr,
                                     std::string line, bool partial) {
  const auto it = running_.find(pid);
  if (it == running_.end()) return;
  Job& job = *it->second;
  if (is_stderr) {
    if (!line.empty()) job.stderr_tail = line.substr(0, kMaxStderrTail);
    return;
  }
  const size_t size = line.size() + (partial ? 0 : 1);
  if (job.dropped > 0 ||
      job.text.size() + size > options_.max_text_bytes - kMarkerRoom) {
    job.dropped += size;
    return;
  }
  job.text += line;
  if (!partial) job.text += '\n';
}

void StackCollector::OnProcessExited(pid_t pid, const base::ExitInfo& info) {
  const auto it = running_.find(pid);
  if (it == running_.end()) return;
  const std::shared_ptr<Job> job = it->second;
  running_.erase(it);
  job->tool_pid = -1;
  job->timer.cancel();
  if (stopped_) return;
  const std::string& tool = job->tools[job->next - 1].name;
  // Killed while attached, the tool may leave the rank stopped (a SIGSTOP
  // of its attach not yet taken): the rank runs on.
  if (job->timed_out && !job->rank_exited && ProcessState(job->pid) == 'T')
    ::kill(job->pid, SIGCONT);
  if (job->dropped > 0) {
    job->text += "[stack output over " +
                 std::to_string(options_.max_text_bytes / 1024) +
                 " KiB: " + std::to_string(job->dropped) + " bytes dropped]\n";
  }
  const std::string failure = ToolFailure(*job, info, options_.timeout);
  if (!job->text.empty() || failure.empty()) {
    job->result_tool = tool;
    job->result_text = std::move(job->text);
  }
  if (failure.empty()) {
    job->ok = true;
    Finish(job);
  } else {
    spdlog::debug("rank {}: {}", job->rank, failure);
    job->failures.push_back(failure);
    RunNextTool(job);
  }
  StartQueued();
}

void StackCollector::Finish(const std::shared_ptr<Job>& job) {
  by_rank_.erase(job->rank);
  wire::Stacks msg;
  msg.set_rank(job->rank);
  msg.set_tool(job->result_tool);
  msg.set_text(std::move(job->result_text));
  if (!job->ok) {
    std::string why;
    for (const std::string& f : job->failures)
      why += (why.empty() ? "" : "; ") + f;
    msg.set_error(why + PtraceHint(why));
  }
  reply_(msg);
}

void StackCollector::Exited(int rank) {
  const auto it = by_rank_.find(rank);
  if (it == by_rank_.end()) return;
  const std::shared_ptr<Job> job = it->second;
  job->rank_exited = true;
  const auto queued = std::find(queue_.begin(), queue_.end(), job);
  if (queued == queue_.end()) return;  // running: ends after its tool
  queue_.erase(queued);
  job->failures.push_back("the rank exited before its stacks were taken");
  Finish(job);
}

void StackCollector::Stop() {
  stopped_ = true;
  for (auto& [pid, job] : running_) {
    job->timer.cancel();
    tools_.Signal(pid, SIGKILL);
  }
  queue_.clear();
  by_rank_.clear();
}

}  // namespace dslaunch::agent
