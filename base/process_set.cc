#include "base/process_set.h"

#include <fcntl.h>        // open, O_CLOEXEC
#include <linux/sched.h>  // clone_args, CLONE_INTO_CGROUP
#include <pthread.h>      // pthread_sigmask
#include <sched.h>        // sched_setaffinity
#include <signal.h>       // kill
#include <sys/mman.h>     // mmap (the child's stack)
#include <sys/prctl.h>    // PR_SET_PDEATHSIG
#include <sys/stat.h>     // stat
#include <sys/syscall.h>  // SYS_clone3
#include <sys/wait.h>     // WIFSIGNALED
#include <unistd.h>       // fork, execve, pipe2

#include <array>
#include <boost/asio/buffer.hpp>
#include <boost/asio/posix/stream_descriptor.hpp>
#include <boost/asio/read.hpp>
#include <boost/asio/steady_timer.hpp>
#include <cerrno>
#include <cstring>
#include <utility>  // exchange

#include "base/child_reaper.h"
#include "base/host_info.h"
#include "base/line_splitter.h"

extern char** environ;

namespace dslaunch::base {

namespace asio = boost::asio;

struct ProcessSet::Child {
  explicit Child(asio::io_context& io)
      : out(io), err(io), report(io), drain_timer(io) {}
  struct Stream {
    explicit Stream(asio::io_context& io) : pipe(io) {}
    asio::posix::stream_descriptor pipe;
    LineSplitter lines;
    std::array<char, 64 * 1024> buffer;
    bool open = false;
    bool reading = false;
  };
  Stream& stream(bool is_stderr) { return is_stderr ? err : out; }

  pid_t pid = -1;
  int stdin_fd = -1;
  int destroy_signal = SIGKILL;
  Stream out, err;
  // The exec report pipe: end of file once the child exec'd (close-on-exec),
  // {stage, errno} when it could not. Read on the loop: spawning does not
  // wait for the child's exec.
  asio::posix::stream_descriptor report;
  bool report_open = false;
  std::array<int, 2> reported{};
  // For the report's words.
  std::string what_chdir, what_cgroup, what_affinity, what_exec;
  bool reaped = false;
  ExitInfo info;
  asio::steady_timer drain_timer;
};

StatusOr<std::string> ResolveProgram(
    const std::string& program, const std::string& path_env,
    const std::function<Status(const std::string&)>& accept) {
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
      if (!accept || accept(candidate).ok()) return candidate;
    }
    start = end + 1;
  }
  return NotFound("command not found: " + program);
}

namespace {

std::vector<char*> CStrings(const std::vector<std::string>& v) {
  std::vector<char*> out;
  for (const auto& s : v) out.push_back(const_cast<char*>(s.c_str()));
  out.push_back(nullptr);
  return out;
}

// The child's environment: spec.env, on top of ours when inherit_env.
std::vector<std::string> ChildEnv(const ProcessSpec& spec) {
  if (!spec.inherit_env) return spec.env;
  std::vector<std::string> env;
  for (char** e = environ; *e; ++e) {
    const std::string kv = *e;
    const std::string key = kv.substr(0, kv.find('='));
    bool overridden = false;
    for (const auto& o : spec.env) overridden |= o.rfind(key + "=", 0) == 0;
    if (!overridden) env.push_back(kv);
  }
  env.insert(env.end(), spec.env.begin(), spec.env.end());
  return env;
}

std::string PathOf(const std::vector<std::string>& env) {
  for (const auto& kv : env) {
    if (kv.rfind("PATH=", 0) == 0) return kv.substr(5);
  }
  return "/bin:/usr/bin";  // as execvp does
}

// Everything the child needs, made before fork: the child only makes
// async-signal-safe calls.
struct ChildPlan {
  pid_t parent = -1;
  bool fail_at_once = false;  // the program was not found
  bool new_session = false;
  int death_signal = SIGKILL;
  pid_t tracer = 0;
  int in_r = -1, out_w = -1, err_w = -1, report_w = -1;
  const char* path = nullptr;
  const char* cwd = "";
  const char* cgroup_procs = "";
  const cpu_set_t* cpus = nullptr;  // sched_setaffinity before exec
  char** argv = nullptr;
  char** envp = nullptr;
};

// Stages reported back through the report pipe as {stage, errno}.
enum Stage : int { kChdir = 1, kExec = 2, kCgroup = 3, kAffinity = 4 };

[[noreturn]] DSL_NO_ASAN void ReportAndExit(int report_w, int stage, int err) {
  int report[2] = {stage, err};
  ssize_t ignored = ::write(report_w, report, sizeof(report));
  (void)ignored;
  ::_exit(127);
}

// In the child, before exec: only async-signal-safe calls, and, as it may
// share our memory (SpawnSharingMemory), no writes but to its own stack.
[[noreturn]] DSL_NO_ASAN void ExecChild(const ChildPlan& p) {
  if (p.new_session) {
    ::setsid();
  } else {
    ::setpgid(0, 0);
  }
  ::prctl(PR_SET_PDEATHSIG, p.death_signal);
  if (::getppid() != p.parent) ::_exit(127);  // the parent is already gone
  // Without Yama this fails (EINVAL) and nothing is needed.
  if (p.tracer > 0) ::prctl(PR_SET_PTRACER, p.tracer, 0, 0, 0);
  if (p.fail_at_once) ::_exit(127);
  if (p.cgroup_procs[0] != '\0') {
    // Joins before any of the program's code runs ("0": this process).
    const int fd = ::open(p.cgroup_procs, O_WRONLY | O_CLOEXEC);
    if (fd < 0 || ::write(fd, "0", 1) != 1)
      ReportAndExit(p.report_w, kCgroup, errno);
    ::close(fd);
  }
  if (p.cpus != nullptr && ::sched_setaffinity(0, sizeof(cpu_set_t), p.cpus))
    ReportAndExit(p.report_w, kAffinity, errno);
  const int in_fd = p.in_r >= 0 ? p.in_r : ::open("/dev/null", O_RDONLY);
  ::dup2(in_fd, 0);
  if (p.out_w >= 0) ::dup2(p.out_w, 1);
  if (p.err_w >= 0) ::dup2(p.err_w, 2);
  // Nothing of the parent's (sockets, listeners) leaks into the child.
  PrepareChildForExec();
  if (p.cwd[0] != '\0' && ::chdir(p.cwd) != 0) {
    ReportAndExit(p.report_w, kChdir, errno);
  }
  ::execve(p.path, p.argv, p.envp);
  ReportAndExit(p.report_w, kExec, errno);
}

[[noreturn]] DSL_NO_ASAN void ChildMain(void* plan) {
  ExecChild(*static_cast<const ChildPlan*>(plan));
}

#if defined(__x86_64__) && defined(CLONE_INTO_CGROUP)
// clone3 whose child starts on args->stack and runs fn(arg), which must not
// return; in the parent, the child's pid or -errno. The child's first
// instruction is after the syscall with an empty stack, so no compiled code
// may run there before fn: hence these few instructions (rcx and r11 are
// the only registers the syscall changes besides rax).
long Clone3Run(clone_args* args, void (*fn)(void*), void* arg) {
  register long rax asm("rax") = SYS_clone3;
  register clone_args* rdi asm("rdi") = args;
  register long rsi asm("rsi") = sizeof(clone_args);
  register void (*r12)(void*) asm("r12") = fn;
  register void* r13 asm("r13") = arg;
  asm volatile(
      "syscall\n\t"
      "test %%rax, %%rax\n\t"
      "jnz 1f\n\t"
      "xor %%ebp, %%ebp\n\t"
      "mov %%r13, %%rdi\n\t"
      "call *%%r12\n\t"
      "ud2\n"
      "1:"
      : "+r"(rax)
      : "r"(rdi), "r"(rsi), "r"(r12), "r"(r13)
      : "rcx", "r11", "memory", "cc");
  return rax;
}

// Like posix_spawn: the child shares our memory until it execs
// (CLONE_VM | CLONE_VFORK, on a stack of its own), so nothing of our
// address space is copied and no page of ours turns copy-on-write; a fork
// of the agent cost ~0.5 ms of CPU per rank in page-table copies and faults.
// With cgroup_fd >= 0 the child starts in that cgroup (CLONE_INTO_CGROUP,
// Linux 5.7). Returns the pid, or -1 with errno (ENOSYS: no clone3, or a
// seccomp filter refuses it).
pid_t SpawnSharingMemory(ChildPlan* plan, int cgroup_fd) {
  constexpr size_t kStack = 64 * 1024;  // ExecChild needs a few KiB
  constexpr size_t kGuard = 4096;       // below it: an overflow faults
  void* map = ::mmap(nullptr, kGuard + kStack, PROT_READ | PROT_WRITE,
                     MAP_PRIVATE | MAP_ANONYMOUS | MAP_STACK, -1, 0);
  if (map == MAP_FAILED) return -1;
  if (::mprotect(map, kGuard, PROT_NONE) != 0) {
    const int err = errno;
    ::munmap(map, kGuard + kStack);
    errno = err;
    return -1;
  }
  clone_args args{};
  args.flags = CLONE_VM | CLONE_VFORK;
  args.exit_signal = SIGCHLD;
  args.stack = reinterpret_cast<uint64_t>(map) + kGuard;
  args.stack_size = kStack;
  if (cgroup_fd >= 0) {
    args.flags |= CLONE_INTO_CGROUP;
    args.cgroup = static_cast<uint64_t>(cgroup_fd);
  }
  const long pid = Clone3Run(&args, ChildMain, plan);
  ::munmap(map, kGuard + kStack);  // the child exec'd or exited: we run on
  if (pid < 0) {
    errno = static_cast<int>(-pid);
    return -1;
  }
  return static_cast<pid_t>(pid);
}
#else
pid_t SpawnSharingMemory(ChildPlan*, int) {
  errno = ENOSYS;
  return -1;
}
#endif

// Starts the child that runs ExecChild(*plan); returns its pid, or -1 with
// errno. In the cgroup `cgroup_dir` (if any) from its first instruction
// where the kernel can: moving a process in afterwards costs an RCU grace
// period, ~10 ms per rank at launch. Otherwise the child joins it itself
// (cgroup_procs keeps the path alive for it).
pid_t StartChild(ChildPlan* plan, const std::string& cgroup_dir,
                 std::string* cgroup_procs) {
  if (!cgroup_dir.empty()) {
    const int fd =
        ::open(cgroup_dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd >= 0) {
      const pid_t pid = SpawnSharingMemory(plan, fd);
      ::close(fd);
      if (pid > 0) return pid;
    }
    *cgroup_procs = cgroup_dir + "/cgroup.procs";
    plan->cgroup_procs = cgroup_procs->c_str();
  }
  const pid_t pid = SpawnSharingMemory(plan, -1);
  if (pid > 0) return pid;
  const pid_t forked = ::fork();
  // A forked child skipped nothing of glibc's bookkeeping; the clone3 child
  // above did (its cached thread id is ours): ExecChild calls nothing that
  // reads it.
  if (forked == 0) ExecChild(*plan);
  return forked;
}

// The four pipes of a spawn (stdin, stdout, stderr, the exec report),
// close-on-exec; closes whatever is still open when it goes.
struct SpawnPipes {
  int fds[8] = {-1, -1, -1, -1, -1, -1, -1, -1};
  int* in = fds;
  int* out = fds + 2;
  int* err = fds + 4;
  int* report = fds + 6;
  SpawnPipes() = default;
  SpawnPipes(const SpawnPipes&) = delete;
  SpawnPipes& operator=(const SpawnPipes&) = delete;
  ~SpawnPipes() {
    for (int fd : fds) {
      if (fd >= 0) ::close(fd);
    }
  }
  Status Open(const ProcessSpec& spec) {
    if ((spec.stdin_pipe && ::pipe2(in, O_CLOEXEC) != 0) ||
        (spec.capture_output &&
         (::pipe2(out, O_CLOEXEC) != 0 || ::pipe2(err, O_CLOEXEC) != 0)) ||
        ::pipe2(report, O_CLOEXEC) != 0) {
      return ErrnoStatus("pipe", errno);
    }
    return Status::Ok();
  }
  // Hands the descriptor over: the destructor no longer closes it.
  int Take(int* fd) { return std::exchange(*fd, -1); }
  void CloseChildEnds() {
    for (int* fd : {&in[0], &out[1], &err[1], &report[1]}) {
      if (*fd >= 0) ::close(Take(fd));
    }
  }
};

}  // namespace

ProcessSet::ProcessSet(asio::io_context& io, Delegate* delegate)
    : io_(io), delegate_(delegate) {
  ChildReaper::Of(io_);  // SIGCHLD is caught before the first child
}

ProcessSet::~ProcessSet() {
  *alive_ = false;
  ChildReaper& reaper = ChildReaper::Of(io_);
  for (auto& [pid, c] : children_) {
    if (!c->reaped) {
      if (c->destroy_signal != 0) ::kill(-pid, c->destroy_signal);
      reaper.Forget(pid);
    }
    if (c->stdin_fd >= 0) ::close(std::exchange(c->stdin_fd, -1));
    boost::system::error_code ignored;
    c->out.pipe.close(ignored);
    c->err.pipe.close(ignored);
    c->drain_timer.cancel();
  }
}

StatusOr<pid_t> ProcessSet::Spawn(const ProcessSpec& spec) {
  if (spec.argv.empty()) return InvalidArgument("empty argv");
  const std::vector<std::string> env = ChildEnv(spec);
  std::string error, path = spec.argv[0];
  StatusOr<std::string> resolved = ResolveProgram(spec.argv[0], PathOf(env));
  if (resolved.ok()) {
    path = *resolved;
  } else {
    error = resolved.status().message();
  }
  SpawnPipes pipes;
  RETURN_IF_ERROR(pipes.Open(spec));
  auto argv = CStrings(spec.argv);
  auto envp = CStrings(env);
  cpu_set_t cpus;
  CPU_ZERO(&cpus);
  for (int cpu : spec.cpus) {
    if (cpu < 0 || cpu >= CPU_SETSIZE)
      return InvalidArgument("no CPU " + std::to_string(cpu) + " to bind to");
    CPU_SET(cpu, &cpus);
  }
  ChildPlan plan{::getpid(),        !error.empty(),   spec.new_session,
                 spec.death_signal, spec.tracer,      pipes.in[0],
                 pipes.out[1],      pipes.err[1],     pipes.report[1],
                 path.c_str(),      spec.cwd.c_str(), "",
                 nullptr,           argv.data(),      envp.data()};
  if (!spec.cpus.empty()) plan.cpus = &cpus;
  if (!spec.stdin_pipe && spec.stdin_fd >= 0) plan.in_r = spec.stdin_fd;
  // Every signal blocked across the start: the child must not run the
  // parent's handlers (Asio's signal pipe is shared) before it resets them.
  sigset_t all, old_mask;
  sigfillset(&all);
  ::pthread_sigmask(SIG_SETMASK, &all, &old_mask);
  std::string cgroup_procs;
  const pid_t pid = StartChild(&plan, spec.cgroup_dir, &cgroup_procs);
  const int fork_errno = errno;
  ::pthread_sigmask(SIG_SETMASK, &old_mask, nullptr);
  if (pid < 0) return ErrnoStatus("fork", fork_errno);
  if (!spec.new_session) ::setpgid(pid, pid);  // so kill(-pid) works at once
  pipes.CloseChildEnds();
  auto c = std::make_shared<Child>(io_);
  c->pid = pid;
  c->destroy_signal = spec.destroy_signal;
  c->info.error = error;
  c->what_chdir = "cannot change directory to '" + spec.cwd + "'";
  c->what_cgroup = "cannot join cgroup '" + spec.cgroup_dir + "'";
  c->what_exec = "cannot execute '" + path + "'";
  c->what_affinity = "cannot bind to CPUs " + CpuListString(spec.cpus);
  c->report.assign(pipes.Take(&pipes.report[0]));
  c->report_open = true;
  c->stdin_fd = pipes.Take(&pipes.in[1]);
  if (spec.capture_output) {
    c->out.pipe.assign(pipes.Take(&pipes.out[0]));
    c->err.pipe.assign(pipes.Take(&pipes.err[0]));
    c->out.open = c->err.open = true;
  }
  children_[pid] = c;
  ChildReaper::Of(io_).Watch(
      pid, {[pid] { ::kill(-pid, SIGKILL); },  // what is left of its group
            [this, c, alive = alive_](int status) {
              if (*alive) OnReaped(c, status);
            }});
  ReadExecReport(c);
  StartRead(c, false);
  StartRead(c, true);
  return pid;
}

void ProcessSet::ReadExecReport(const std::shared_ptr<Child>& c) {
  asio::async_read(
      c->report, asio::buffer(c->reported),
      [this, c, alive = alive_](const boost::system::error_code& ec, size_t) {
        if (!*alive) return;
        if (!ec && c->info.error.empty()) {  // the child could not go on
          const int stage = c->reported[0];
          c->info.error = (stage == kChdir      ? c->what_chdir
                           : stage == kCgroup   ? c->what_cgroup
                           : stage == kAffinity ? c->what_affinity
                                                : c->what_exec) +
                          ": " + std::strerror(c->reported[1]);
        }
        boost::system::error_code ignored;
        c->report.close(ignored);
        c->report_open = false;
        MaybeFinish(c);
      });
}

int ProcessSet::StdinOf(pid_t pid) const {
  auto it = children_.find(pid);
  return it == children_.end() ? -1 : it->second->stdin_fd;
}

void ProcessSet::CloseStdin(pid_t pid) {
  auto it = children_.find(pid);
  if (it != children_.end() && it->second->stdin_fd >= 0) {
    ::close(std::exchange(it->second->stdin_fd, -1));
  }
}

// Whether the child has not ended yet (not even as a zombie not yet reaped:
// the reaper runs on this thread, so its end is still to be seen).
static bool StillRuns(pid_t pid) {
  siginfo_t si{};
  return !(::waitid(P_PID, static_cast<id_t>(pid), &si,
                    WEXITED | WNOHANG | WNOWAIT) == 0 &&
           si.si_pid == pid);
}

static void SignalChild(ProcessSet::Child& c, int sig) {
  if (c.reaped) return;
  if (StillRuns(c.pid)) c.info.signalled = true;
  ::kill(-c.pid, sig);
}

void ProcessSet::Signal(pid_t pid, int sig) {
  auto it = children_.find(pid);
  if (it != children_.end()) SignalChild(*it->second, sig);
}

void ProcessSet::SignalAll(int sig) {
  for (auto& [pid, c] : children_) SignalChild(*c, sig);
}

void ProcessSet::OnReaped(const std::shared_ptr<Child>& c, int status) {
  c->reaped = true;
  c->info.wait_status = status;
  if (WIFSIGNALED(status)) {
    c->info.signal = WTERMSIG(status);
  } else {
    c->info.exit_code = WEXITSTATUS(status);
  }
  if (c->out.open || c->err.open) ArmDrainTimer(c);
  MaybeFinish(c);
}

void ProcessSet::ArmDrainTimer(const std::shared_ptr<Child>& c) {
  // Output still held open by a grandchild does not hold the exit back
  // forever; while output is paused nothing is dropped, so wait longer.
  c->drain_timer.expires_after(drain_after_);
  c->drain_timer.async_wait(
      [this, c, alive = alive_](const boost::system::error_code& ec) {
        if (ec || !*alive) return;
        if (paused_) return ArmDrainTimer(c);  // the owner resumes or stops us
        CloseStream(c, false);
        CloseStream(c, true);
      });
}

void ProcessSet::StartRead(const std::shared_ptr<Child>& c, bool is_stderr) {
  Child::Stream& s = c->stream(is_stderr);
  if (!s.open || s.reading || paused_) return;
  s.reading = true;
  s.pipe.async_read_some(asio::buffer(s.buffer),
                         [this, c, is_stderr, alive = alive_](
                             const boost::system::error_code& ec, size_t n) {
                           if (!*alive) return;
                           OnRead(c, is_stderr, ec, n);
                         });
}

void ProcessSet::OnRead(const std::shared_ptr<Child>& c, bool is_stderr,
                        const boost::system::error_code& ec, size_t n) {
  Child::Stream& s = c->stream(is_stderr);
  s.reading = false;
  if (!s.open) return;
  if (ec) return CloseStream(c, is_stderr);
  std::vector<LineSplitter::Piece> pieces;
  s.lines.Feed(std::string_view(s.buffer.data(), n), &pieces);
  const auto alive = alive_;
  for (auto& piece : pieces) {
    // A piece of a line longer than the limit is partial (no newline follows
    // it), so that the launcher joins the pieces byte-exact.
    delegate_->OnProcessOutput(c->pid, is_stderr, std::move(piece.text),
                               !piece.ends_line);
    if (!*alive) return;  // the delegate destroyed us
  }
  StartRead(c, is_stderr);
}

void ProcessSet::CloseStream(const std::shared_ptr<Child>& c, bool is_stderr) {
  Child::Stream& s = c->stream(is_stderr);
  if (!s.open) return;
  s.open = false;
  boost::system::error_code ignored;
  s.pipe.close(ignored);
  std::string rest;
  if (s.lines.Finish(&rest)) {
    delegate_->OnProcessOutput(c->pid, is_stderr, std::move(rest), true);
  }
  MaybeFinish(c);
}

void ProcessSet::MaybeFinish(const std::shared_ptr<Child>& c) {
  if (!c->reaped || c->out.open || c->err.open || c->report_open) return;
  if (children_.erase(c->pid) == 0) return;  // already reported
  c->drain_timer.cancel();
  if (c->stdin_fd >= 0) ::close(std::exchange(c->stdin_fd, -1));
  delegate_->OnProcessExited(c->pid, c->info);
}

void ProcessSet::PauseOutput() { paused_ = true; }

void ProcessSet::ResumeOutput() {
  if (!paused_) return;
  paused_ = false;
  for (auto& [pid, c] : children_) {
    StartRead(c, false);
    StartRead(c, true);
  }
}

}  // namespace dslaunch::base
