#include "agent/worker_set.h"

#include <fcntl.h>      // open, O_CLOEXEC
#include <signal.h>     // kill, sigprocmask
#include <sys/prctl.h>  // PR_SET_PDEATHSIG
#include <sys/stat.h>   // stat
#include <sys/wait.h>   // waitpid
#include <unistd.h>     // fork, execve, pipe2

#include <array>
#include <boost/asio/buffer.hpp>
#include <boost/asio/posix/stream_descriptor.hpp>
#include <boost/asio/steady_timer.hpp>
#include <cerrno>
#include <cstring>
#include <utility>  // exchange

#include "agent/line_splitter.h"
#include "proto/host_info.h"

namespace dslaunch::agent {

namespace asio = boost::asio;

// How long a reaped worker's pipes may stay open (held by a grandchild)
// before the worker is reported finished anyway.
static constexpr auto kDrainAfterExit = std::chrono::seconds(2);

struct WorkerSet::Worker {
  Worker(asio::io_context& io, int out_fd, int err_fd)
      : out(io, out_fd), err(io, err_fd), drain_timer(io) {}
  struct Stream {
    Stream(asio::io_context& io, int fd) : pipe(io, fd) {}
    asio::posix::stream_descriptor pipe;
    LineSplitter lines;
    std::array<char, 64 * 1024> buffer;
    bool open = true;
    bool reading = false;
  };
  Stream& stream(bool is_stderr) { return is_stderr ? err : out; }

  int rank = 0;
  pid_t pid = -1;
  Stream out, err;
  bool reaped = false;
  ExitInfo info;
  asio::steady_timer drain_timer;
};

StatusOr<std::string> ResolveProgram(const std::string& program,
                                     const std::string& path_env) {
  if (program.empty()) return InvalidArgument("empty program name");
  if (program.find('/') != std::string::npos) return program;
  size_t start = 0;
  while (start <= path_env.size()) {
    size_t end = path_env.find(':', start);
    if (end == std::string::npos) end = path_env.size();
    std::string dir = path_env.substr(start, end - start);
    std::string candidate = (dir.empty() ? "." : dir) + "/" + program;
    struct stat st;
    if (::stat(candidate.c_str(), &st) == 0 && S_ISREG(st.st_mode) &&
        ::access(candidate.c_str(), X_OK) == 0) {
      return candidate;
    }
    start = end + 1;
  }
  return NotFound("command not found: " + program);
}

static std::vector<char*> CStrings(const std::vector<std::string>& v) {
  std::vector<char*> out;
  for (const auto& s : v) out.push_back(const_cast<char*>(s.c_str()));
  out.push_back(nullptr);
  return out;
}

static std::string EnvValue(const std::vector<std::string>& env,
                            const std::string& key) {
  for (const auto& kv : env) {
    if (kv.size() > key.size() && kv.compare(0, key.size(), key) == 0 &&
        kv[key.size()] == '=') {
      return kv.substr(key.size() + 1);
    }
  }
  return "";
}

static bool HasEnv(const std::vector<std::string>& env,
                   const std::string& key) {
  for (const auto& kv : env) {
    if (kv.compare(0, key.size() + 1, key + "=") == 0) return true;
  }
  return false;
}

// In the child, between fork and exec: only async-signal-safe calls.
[[noreturn]] static void ExecChild(pid_t parent, int out_w, int err_w,
                                   int report_w, const char* path,
                                   const char* cwd, char** argv, char** envp) {
  ::setpgid(0, 0);
  ::prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (::getppid() != parent) ::_exit(127);  // the agent is already gone
  int null_fd = ::open("/dev/null", O_RDONLY);
  ::dup2(null_fd, 0);
  ::dup2(out_w, 1);
  ::dup2(err_w, 2);
  // Nothing of the agent's (control socket, listeners) leaks into the rank.
  proto::PrepareChildForExec();
  int report[2] = {0, 0};  // {stage, errno}: 1 = chdir, 2 = exec
  if (cwd[0] != '\0' && ::chdir(cwd) != 0) {
    report[0] = 1;
  } else {
    ::execve(path, argv, envp);
    report[0] = 2;
  }
  report[1] = errno;
  ssize_t ignored = ::write(report_w, report, sizeof(report));
  (void)ignored;
  ::_exit(127);
}

WorkerSet::WorkerSet(asio::io_context& io, Delegate* delegate)
    : io_(io), delegate_(delegate), sigchld_(io, SIGCHLD) {
  WaitForSigchld();
}

WorkerSet::~WorkerSet() {
  *alive_ = false;
  for (auto& [pid, w] : workers_) {
    if (!w->reaped) ::kill(-pid, SIGKILL);
  }
}

namespace {

// The three pipes of a spawn (stdout, stderr, the child's exec report),
// close-on-exec; closes whatever is still open when it goes.
struct SpawnPipes {
  int fds[6] = {-1, -1, -1, -1, -1, -1};
  int* out = fds;
  int* err = fds + 2;
  int* report = fds + 4;
  SpawnPipes() = default;
  SpawnPipes(const SpawnPipes&) = delete;
  SpawnPipes& operator=(const SpawnPipes&) = delete;
  ~SpawnPipes() {
    for (int fd : fds) {
      if (fd >= 0) ::close(fd);
    }
  }
  Status Open() {
    if (::pipe2(out, O_CLOEXEC) != 0 || ::pipe2(err, O_CLOEXEC) != 0 ||
        ::pipe2(report, O_CLOEXEC) != 0) {
      return ErrnoStatus("pipe", errno);
    }
    return Status::Ok();
  }
  // Hands the descriptor over: the destructor no longer closes it.
  int Take(int* fd) { return std::exchange(*fd, -1); }
};

// Waits for the child's exec: end of file on the report pipe means it
// succeeded; otherwise the child wrote {step, errno} (1 = chdir, 2 = exec).
std::string ExecError(int report_fd, const WorkerSpec& spec,
                      const std::string& path) {
  int reported[2] = {0, 0};
  ssize_t got;
  do {
    got = ::read(report_fd, reported, sizeof(reported));
  } while (got < 0 && errno == EINTR);
  if (got != sizeof(reported)) return "";
  return std::string(reported[0] == 1
                         ? "cannot change directory to '" + spec.cwd + "'"
                         : "cannot execute '" + path + "'") +
         ": " + std::strerror(reported[1]);
}

}  // namespace

StatusOr<pid_t> WorkerSet::Spawn(const WorkerSpec& spec) {
  if (spec.argv.empty()) return InvalidArgument("empty argv");
  std::string error, path = spec.argv[0];
  StatusOr<std::string> resolved =
      ResolveProgram(spec.argv[0], HasEnv(spec.env, "PATH")
                                       ? EnvValue(spec.env, "PATH")
                                       : "/bin:/usr/bin");  // as execvp does
  if (resolved.ok()) {
    path = *resolved;
  } else {
    error = resolved.status().message();
  }
  SpawnPipes pipes;
  RETURN_IF_ERROR(pipes.Open());
  auto argv = CStrings(spec.argv);
  auto envp = CStrings(spec.env);
  const pid_t parent = ::getpid();
  const pid_t pid = ::fork();
  if (pid < 0) return ErrnoStatus("fork", errno);
  if (pid == 0) {
    if (!error.empty()) ::_exit(127);
    ExecChild(parent, pipes.out[1], pipes.err[1], pipes.report[1], path.c_str(),
              spec.cwd.c_str(), argv.data(), envp.data());
  }
  ::setpgid(pid, pid);  // also here, so kill(-pid) works at once
  ::close(pipes.Take(&pipes.out[1]));
  ::close(pipes.Take(&pipes.err[1]));
  ::close(pipes.Take(&pipes.report[1]));
  if (error.empty()) error = ExecError(pipes.report[0], spec, path);

  auto w = std::make_shared<Worker>(io_, pipes.Take(&pipes.out[0]),
                                    pipes.Take(&pipes.err[0]));
  w->rank = spec.rank;
  w->pid = pid;
  w->info.error = error;
  workers_[pid] = w;
  StartRead(w, false);
  StartRead(w, true);
  return pid;
}

void WorkerSet::SignalAll(int sig) {
  for (auto& [pid, w] : workers_) {
    if (!w->reaped) ::kill(-pid, sig);
  }
}

void WorkerSet::WaitForSigchld() {
  sigchld_.async_wait(
      [this, alive = alive_](const boost::system::error_code& ec, int) {
        if (ec || !*alive) return;
        ReapAll();
        WaitForSigchld();
      });
}

void WorkerSet::ReapAll() {
  std::vector<std::shared_ptr<Worker>> reaped;
  for (auto& [pid, w] : workers_) {
    if (w->reaped) continue;
    // Look without reaping: while the leader is a zombie its pid, and so its
    // process group id, cannot be reused, so what is left of its group (a
    // rank's own children) can be killed safely before the reap.
    siginfo_t si{};
    if (::waitid(P_PID, static_cast<id_t>(pid), &si,
                 WEXITED | WNOHANG | WNOWAIT) != 0 ||
        si.si_pid != pid) {
      continue;
    }
    ::kill(-pid, SIGKILL);
    int status = 0;
    if (::waitpid(pid, &status, 0) != pid) continue;
    w->reaped = true;
    if (WIFSIGNALED(status))
      w->info.signal = WTERMSIG(status);
    else
      w->info.exit_code = WEXITSTATUS(status);
    reaped.push_back(w);
  }
  for (auto& w : reaped) {
    ArmDrainTimer(w);
    MaybeFinish(w);
  }
}

void WorkerSet::ArmDrainTimer(const std::shared_ptr<Worker>& w) {
  // Output still held open by a grandchild does not hold the exit back
  // forever; while output is paused nothing is dropped, so wait longer.
  w->drain_timer.expires_after(kDrainAfterExit);
  w->drain_timer.async_wait(
      [this, w, alive = alive_](const boost::system::error_code& ec) {
        if (ec || !*alive) return;
        if (paused_) return ArmDrainTimer(w);  // the owner resumes or stops us
        CloseStream(w, false);
        CloseStream(w, true);
      });
}

void WorkerSet::StartRead(const std::shared_ptr<Worker>& w, bool is_stderr) {
  Worker::Stream& s = w->stream(is_stderr);
  if (!s.open || s.reading || paused_) return;
  s.reading = true;
  s.pipe.async_read_some(asio::buffer(s.buffer),
                         [this, w, is_stderr, alive = alive_](
                             const boost::system::error_code& ec, size_t n) {
                           if (!*alive) return;
                           OnRead(w, is_stderr, ec, n);
                         });
}

void WorkerSet::OnRead(const std::shared_ptr<Worker>& w, bool is_stderr,
                       const boost::system::error_code& ec, size_t n) {
  Worker::Stream& s = w->stream(is_stderr);
  s.reading = false;
  if (!s.open) return;
  if (ec) return CloseStream(w, is_stderr);
  // Fed one line at a time: of what a line yields, only the last piece ends
  // it; the splitter cuts a longer line into pieces, passed on as partial
  // (no newline follows them) so the launcher can join them byte-exact.
  std::string_view data(s.buffer.data(), n);
  std::vector<std::string> lines;
  while (!data.empty()) {
    const size_t nl = data.find('\n');
    const size_t take = nl == std::string_view::npos ? data.size() : nl + 1;
    lines.clear();
    s.lines.Feed(data.substr(0, take), &lines);
    for (size_t i = 0; i < lines.size(); ++i) {
      const bool ends_line =
          nl != std::string_view::npos && i + 1 == lines.size();
      delegate_->OnWorkerOutput(w->rank, is_stderr, std::move(lines[i]),
                                /*partial=*/!ends_line);
    }
    data.remove_prefix(take);
  }
  StartRead(w, is_stderr);
}

void WorkerSet::CloseStream(const std::shared_ptr<Worker>& w, bool is_stderr) {
  Worker::Stream& s = w->stream(is_stderr);
  if (!s.open) return;
  s.open = false;
  boost::system::error_code ignored;
  s.pipe.close(ignored);
  std::string rest;
  if (s.lines.Finish(&rest)) {
    delegate_->OnWorkerOutput(w->rank, is_stderr, std::move(rest), true);
  }
  MaybeFinish(w);
}

void WorkerSet::MaybeFinish(const std::shared_ptr<Worker>& w) {
  if (!w->reaped || w->out.open || w->err.open) return;
  if (workers_.erase(w->pid) == 0) return;  // already reported
  w->drain_timer.cancel();
  delegate_->OnWorkerExited(w->rank, w->pid, w->info);
}

void WorkerSet::PauseOutput() { paused_ = true; }

void WorkerSet::ResumeOutput() {
  if (!paused_) return;
  paused_ = false;
  for (auto& [pid, w] : workers_) {
    StartRead(w, false);
    StartRead(w, true);
  }
}

}  // namespace dslaunch::agent
