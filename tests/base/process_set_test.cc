#include "base/process_set.h"

#include <gtest/gtest.h>
#include <linux/filter.h>   // sock_filter, BPF_STMT
#include <linux/seccomp.h>  // SECCOMP_MODE_FILTER
#include <signal.h>
#include <sys/prctl.h>
#include <sys/syscall.h>  // SYS_clone3
#include <sys/wait.h>
#include <unistd.h>

#include <boost/asio/io_context.hpp>
#include <cerrno>
#include <chrono>
#include <cstddef>  // offsetof
#include <fstream>
#include <iterator>  // size
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "base/child_reaper.h"
#include "base/unix_socket.h"
#include "tests/common/run_until.h"

namespace dslaunch::base {
namespace {

namespace asio = boost::asio;
using dslaunch::testing::RunUntil;

class Recorder : public ProcessSet::Delegate {
 public:
  void OnProcessOutput(pid_t pid, bool is_stderr, std::string line,
                       bool partial) override {
    (is_stderr ? err : out)[pid].push_back(line);
    if (partial) partials[pid].push_back(line);
    last_event_was_exit[pid] = false;
  }
  void OnProcessExited(pid_t pid, const ExitInfo& info) override {
    exits[pid] = info;
    last_event_was_exit[pid] = true;
  }
  std::map<pid_t, std::vector<std::string>> out, err, partials;
  std::map<pid_t, ExitInfo> exits;
  std::map<pid_t, bool> last_event_was_exit;
};

ProcessSpec Shell(const std::string& script) {
  ProcessSpec spec;
  spec.argv = {"/bin/sh", "-c", script};
  spec.env = {"PATH=/usr/bin:/bin"};
  return spec;
}

// Field `n` (1-based, after the name) of /proc/<pid>/stat, or "".
std::string StatField(pid_t pid, int n) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string stat((std::istreambuf_iterator<char>(in)),
                   std::istreambuf_iterator<char>());
  const size_t paren = stat.rfind(')');
  if (paren == std::string::npos) return "";
  std::istringstream rest(stat.substr(paren + 2));
  std::string field;
  for (int i = 3; i <= n && rest >> field;) ++i;
  return field;
}

bool IsLive(pid_t pid) {
  const std::string state = StatField(pid, 3);
  return !state.empty() && state != "Z";
}

class ProcessSetTest : public ::testing::Test {
 protected:
  pid_t SpawnOk(const ProcessSpec& spec) {
    StatusOr<pid_t> pid = set_.Spawn(spec);
    EXPECT_TRUE(pid.ok()) << pid.status().message();
    return pid.ok() ? *pid : -1;
  }
  bool WaitForExit(
      pid_t pid, std::chrono::milliseconds timeout = std::chrono::seconds(5)) {
    return RunUntil(
        io_, [&] { return rec_.exits.count(pid) > 0; }, timeout);
  }
  asio::io_context io_;
  Recorder rec_;
  ProcessSet set_{io_, &rec_};
};

TEST_F(ProcessSetTest, RelaysLinesOfBothStreamsAndTheExitCode) {
  const pid_t pid = SpawnOk(Shell("echo a; echo b >&2; printf c; exit 7"));
  ASSERT_TRUE(WaitForExit(pid));
  EXPECT_EQ(rec_.out[pid], (std::vector<std::string>{"a", "c"}));
  EXPECT_EQ(rec_.err[pid], (std::vector<std::string>{"b"}));
  EXPECT_EQ(rec_.partials[pid], (std::vector<std::string>{"c"}));
  EXPECT_EQ(rec_.exits[pid].exit_code, 7);
  EXPECT_EQ(rec_.exits[pid].signal, 0);
  EXPECT_TRUE(WIFEXITED(rec_.exits[pid].wait_status));
  EXPECT_EQ(set_.unfinished(), 0u);
}

TEST_F(ProcessSetTest, ReportsTheSignalThatEndedTheChild) {
  const pid_t pid = SpawnOk(Shell("echo up; exec sleep 30"));
  ASSERT_TRUE(RunUntil(io_, [&] { return rec_.out[pid].size() == 1; }));
  set_.Signal(pid, SIGTERM);
  ASSERT_TRUE(WaitForExit(pid));
  EXPECT_EQ(rec_.exits[pid].signal, SIGTERM);
  EXPECT_TRUE(rec_.exits[pid].signalled);
}

// The agent tells a rank its stop ended from one killed by someone else
// first (tests/launcher/supervise/job_test.cc: the cause of a job's end).
TEST_F(ProcessSetTest, MarksTheChildrenItsSignalReachedAndNotOneDeadBefore) {
  const pid_t stopped = SpawnOk(Shell("echo up; exec sleep 30"));
  const pid_t killed = SpawnOk(Shell("echo up; exec sleep 30"));
  ASSERT_TRUE(RunUntil(io_, [&] {
    return rec_.out[stopped].size() == 1 && rec_.out[killed].size() == 1;
  }));
  // Killed from outside; not reaped yet (the loop does not run meanwhile).
  ASSERT_EQ(::kill(killed, SIGKILL), 0);
  for (int i = 0; i < 500 && StatField(killed, 3) != "Z"; ++i) ::usleep(10000);
  ASSERT_EQ(StatField(killed, 3), "Z");
  set_.SignalAll(SIGTERM);
  ASSERT_TRUE(WaitForExit(stopped));
  ASSERT_TRUE(WaitForExit(killed));
  EXPECT_EQ(rec_.exits[stopped].signal, SIGTERM);
  EXPECT_TRUE(rec_.exits[stopped].signalled);
  EXPECT_EQ(rec_.exits[killed].signal, SIGKILL);
  EXPECT_FALSE(rec_.exits[killed].signalled);
}

TEST_F(ProcessSetTest, ReportsExecFailureWithTheReason) {
  ProcessSpec spec;
  spec.argv = {"/etc/passwd"};  // exists, not executable
  const pid_t pid = SpawnOk(spec);
  ASSERT_TRUE(WaitForExit(pid));
  EXPECT_EQ(rec_.exits[pid].exit_code, 127);
  EXPECT_NE(rec_.exits[pid].error.find("cannot execute '/etc/passwd'"),
            std::string::npos)
      << rec_.exits[pid].error;
}

TEST_F(ProcessSetTest, ReportsAMissingCgroupBeforeTheProgramRuns) {
  ProcessSpec spec = Shell("echo ran");
  spec.cgroup_dir = "/nonexistent-dsl-cgroup";
  const pid_t pid = SpawnOk(spec);
  ASSERT_TRUE(WaitForExit(pid));
  EXPECT_EQ(rec_.exits[pid].exit_code, 127);
  EXPECT_NE(rec_.exits[pid].error.find("cannot join cgroup"), std::string::npos)
      << rec_.exits[pid].error;
  EXPECT_TRUE(rec_.out[pid].empty());
}

TEST_F(ProcessSetTest, ChildLeadsItsOwnProcessGroup) {
  const pid_t pid = SpawnOk(Shell("echo up; exec sleep 30"));
  ASSERT_TRUE(RunUntil(io_, [&] { return rec_.out[pid].size() == 1; }));
  EXPECT_EQ(::getpgid(pid), pid);
  EXPECT_EQ(::getsid(pid), ::getsid(0));  // same session as ours
  set_.SignalAll(SIGKILL);
  ASSERT_TRUE(WaitForExit(pid));
}

TEST_F(ProcessSetTest, ChildLeadsItsOwnSessionWhenAsked) {
  ProcessSpec spec = Shell("echo up; exec sleep 30");
  spec.new_session = true;
  const pid_t pid = SpawnOk(spec);
  ASSERT_TRUE(RunUntil(io_, [&] { return rec_.out[pid].size() == 1; }));
  EXPECT_EQ(::getsid(pid), pid);
  EXPECT_EQ(::getpgid(pid), pid);
  set_.Signal(pid, SIGKILL);
  ASSERT_TRUE(WaitForExit(pid));
}

TEST_F(ProcessSetTest, OutputWrittenRightBeforeTheExitIsReportedBeforeIt) {
  const pid_t pid = SpawnOk(Shell("seq 1 50000; printf end"));
  ASSERT_TRUE(WaitForExit(pid));
  ASSERT_EQ(rec_.out[pid].size(), 50001u);
  EXPECT_EQ(rec_.out[pid][49999], "50000");
  EXPECT_EQ(rec_.out[pid].back(), "end");
  EXPECT_TRUE(rec_.last_event_was_exit[pid]);
}

TEST_F(ProcessSetTest, GrandchildHoldingThePipeDelaysTheExitOnlyByTheDrain) {
  set_.set_drain_after_exit(std::chrono::milliseconds(300));
  // The grandchild leaves the group first, so the kill at the reap misses it.
  const pid_t pid = SpawnOk(
      Shell("setsid sleep 30 & g=$!; "
            "until [ \"$(cut -d' ' -f6 /proc/$g/stat)\" = $g ]; do :; done; "
            "echo $g; exit 2"));
  const auto start = std::chrono::steady_clock::now();
  ASSERT_TRUE(WaitForExit(pid));
  const auto took = std::chrono::steady_clock::now() - start;
  ASSERT_EQ(rec_.out[pid].size(), 1u);
  const pid_t grandchild = std::stoi(rec_.out[pid][0]);
  EXPECT_TRUE(IsLive(grandchild));  // so the pipe was still open
  ::kill(grandchild, SIGKILL);
  EXPECT_EQ(rec_.exits[pid].exit_code, 2);
  EXPECT_GE(took, std::chrono::milliseconds(300));
  EXPECT_LT(took, std::chrono::seconds(3));
}

TEST_F(ProcessSetTest, KillsWhatIsLeftOfTheChildsGroupAtTheReap) {
  const pid_t pid = SpawnOk(Shell("sleep 30 & echo $!; exit 0"));
  ASSERT_TRUE(WaitForExit(pid));
  const pid_t background = std::stoi(rec_.out[pid][0]);
  ASSERT_TRUE(RunUntil(io_, [&] { return !IsLive(background); }));
}

TEST_F(ProcessSetTest, TracksManyChildren) {
  std::vector<pid_t> pids;
  for (int i = 0; i < 64; ++i) {
    pids.push_back(SpawnOk(Shell("echo " + std::to_string(i) + "; exit " +
                                 std::to_string(i % 50))));
  }
  ASSERT_TRUE(RunUntil(
      io_, [&] { return rec_.exits.size() == 64; }, std::chrono::seconds(20)));
  for (int i = 0; i < 64; ++i) {
    EXPECT_EQ(rec_.out[pids[i]], (std::vector<std::string>{std::to_string(i)}));
    EXPECT_EQ(rec_.exits[pids[i]].exit_code, i % 50);
  }
}

TEST_F(ProcessSetTest, StdinPipeCarriesBytesAndClosingItEndsTheInput) {
  ProcessSpec spec = Shell("read line; echo got-$line; cat; echo eof");
  spec.stdin_pipe = true;
  const pid_t pid = SpawnOk(spec);
  ASSERT_GE(set_.StdinOf(pid), 0);
  ASSERT_TRUE(WriteAll(set_.StdinOf(pid), "secret\n").ok());
  ASSERT_TRUE(RunUntil(io_, [&] { return rec_.out[pid].size() == 1; }));
  EXPECT_EQ(rec_.out[pid][0], "got-secret");
  set_.CloseStdin(pid);
  ASSERT_TRUE(WaitForExit(pid));
  EXPECT_EQ(rec_.out[pid].back(), "eof");
}

TEST_F(ProcessSetTest, StdinIsDevNullByDefault) {
  const pid_t pid = SpawnOk(Shell("cat; echo done"));
  ASSERT_TRUE(WaitForExit(pid));
  EXPECT_EQ(rec_.out[pid], (std::vector<std::string>{"done"}));
}

TEST_F(ProcessSetTest, TwoSetsOnOneLoopEachGetOnlyTheirOwnChildren) {
  Recorder other_rec;
  ProcessSet other(io_, &other_rec);
  const pid_t mine = SpawnOk(Shell("exit 3"));
  StatusOr<pid_t> theirs = other.Spawn(Shell("exit 4"));
  ASSERT_TRUE(theirs.ok());
  ASSERT_TRUE(RunUntil(io_, [&] {
    return rec_.exits.size() == 1 && other_rec.exits.size() == 1;
  }));
  EXPECT_EQ(rec_.exits.count(mine), 1u);
  EXPECT_EQ(rec_.exits[mine].exit_code, 3);
  EXPECT_EQ(other_rec.exits.count(*theirs), 1u);
  EXPECT_EQ(other_rec.exits[*theirs].exit_code, 4);
}

TEST_F(ProcessSetTest, NeverReapsAChildItDidNotSpawn) {
  // Another owner's child (forked here, waited for by pid) ends while the
  // set's SIGCHLD handling runs: it must still be there for its owner.
  const pid_t foreign = ::fork();
  if (foreign == 0) ::_exit(9);
  siginfo_t si{};  // wait until it is a zombie, without reaping it
  ASSERT_EQ(::waitid(P_PID, foreign, &si, WEXITED | WNOWAIT), 0);
  const pid_t pid = SpawnOk(Shell("exit 0"));
  ASSERT_TRUE(WaitForExit(pid));
  // The reaper handled SIGCHLD with the foreign zombie waiting all along.
  ASSERT_EQ(::waitid(P_PID, foreign, &si, WEXITED | WNOHANG | WNOWAIT), 0);
  EXPECT_EQ(si.si_pid, foreign);
  int status = 0;
  ASSERT_EQ(::waitpid(foreign, &status, 0), foreign);
  EXPECT_EQ(WEXITSTATUS(status), 9);
}

TEST_F(ProcessSetTest, InheritedEnvironmentTakesOverrides) {
  ::setenv("DSL_PROCESS_SET_TEST", "parent", 1);
  ProcessSpec spec = Shell("echo $DSL_PROCESS_SET_TEST $DSL_EXTRA");
  spec.inherit_env = true;
  spec.env = {"DSL_EXTRA=x"};
  const pid_t pid = SpawnOk(spec);
  ASSERT_TRUE(WaitForExit(pid));
  EXPECT_EQ(rec_.out[pid], (std::vector<std::string>{"parent x"}));
}

TEST(ProcessSet, ChildGetsItsDeathSignalWhenItsParentDies) {
  ::prctl(PR_SET_CHILD_SUBREAPER, 1);  // the orphan comes to us: we see its end
  int fds[2];
  ASSERT_EQ(::pipe(fds), 0);
  const pid_t middle = ::fork();
  if (middle == 0) {  // a parent that spawns, then dies at once
    asio::io_context io;
    Recorder rec;
    ProcessSet set(io, &rec);
    ProcessSpec spec = Shell("echo ready; exec sleep 30");
    spec.death_signal = SIGTERM;
    StatusOr<pid_t> pid = set.Spawn(spec);
    pid_t child = pid.ok() ? *pid : -1;
    // Spawning does not wait for the exec: die only once the child runs
    // (before that, a child whose parent is gone exits 127 on its own).
    if (child > 0 && !dslaunch::testing::RunUntil(
                         io, [&] { return !rec.out[child].empty(); }))
      child = -1;
    (void)!::write(fds[1], &child, sizeof(child));
    ::_exit(0);
  }
  pid_t child = -1;
  ASSERT_EQ(::read(fds[0], &child, sizeof(child)),
            static_cast<ssize_t>(sizeof(child)));
  ::close(fds[0]);
  ::close(fds[1]);
  ASSERT_GT(child, 0);
  ASSERT_EQ(::waitpid(middle, nullptr, 0), middle);
  int status = 0;
  const auto deadline =
      std::chrono::steady_clock::now() + std::chrono::seconds(5);
  pid_t got = 0;
  while (got == 0 && std::chrono::steady_clock::now() < deadline) {
    got = ::waitpid(child, &status, WNOHANG);
    if (got == 0) ::usleep(1000);
  }
  ::prctl(PR_SET_CHILD_SUBREAPER, 0);
  if (got != child) ::kill(child, SIGKILL);
  ASSERT_EQ(got, child);
  ASSERT_TRUE(WIFSIGNALED(status));
  EXPECT_EQ(WTERMSIG(status), SIGTERM);
}

// Where clone3 is refused (kernels before 5.3; container runtimes' seccomp
// profiles answer ENOSYS), children are forked instead and behave the same.
TEST(ProcessSet, StartsChildrenWhereClone3IsRefused) {
  const pid_t tester = ::fork();
  if (tester == 0) {
    sock_filter filter[] = {
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(seccomp_data, nr)),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, SYS_clone3, 0, 1),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | ENOSYS),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
    };
    sock_fprog prog{static_cast<unsigned short>(std::size(filter)), filter};
    if (::prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 ||
        ::prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &prog) != 0)
      ::_exit(2);
    if (::syscall(SYS_clone3, nullptr, 0) != -1 || errno != ENOSYS) ::_exit(3);
    asio::io_context io;
    Recorder rec;
    ProcessSet set(io, &rec);
    StatusOr<pid_t> pid = set.Spawn(Shell("echo ran; exit 5"));
    if (!pid.ok()) ::_exit(4);
    if (!dslaunch::testing::RunUntil(io, [&] { return rec.exits.count(*pid); }))
      ::_exit(5);
    const bool ok = rec.exits[*pid].exit_code == 5 &&
                    rec.out[*pid] == std::vector<std::string>{"ran"};
    ::_exit(ok ? 0 : 6);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(tester, &status, 0), tester);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0)
      << "2: no seccomp here, 3: clone3 not refused, 4: spawn failed, "
         "5: no exit seen, 6: wrong output or exit code";
}

// A child calls PR_SET_PTRACER with exactly the tracer of its spec (the
// agent gives its ranks the stack helper's pid, never its own), and not at
// all without one. Seen through a seccomp filter: PR_SET_PTRACER(4242) kills
// the caller, which the exit shows; no Yama is needed.
TEST(ProcessSet, NamesExactlyTheTracerOfTheSpecAndNoneWithoutOne) {
  constexpr pid_t kTracer = 4242;
  const pid_t tester = ::fork();
  if (tester == 0) {
    sock_filter filter[] = {
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(seccomp_data, nr)),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, SYS_prctl, 0, 5),
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(seccomp_data, args[0])),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, PR_SET_PTRACER, 0, 3),
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(seccomp_data, args[1])),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, kTracer, 0, 1),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_KILL_PROCESS),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
    };
    sock_fprog prog{static_cast<unsigned short>(std::size(filter)), filter};
    if (::prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 ||
        ::prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &prog) != 0)
      ::_exit(2);
    asio::io_context io;
    Recorder rec;
    ProcessSet set(io, &rec);
    ProcessSpec named = Shell("exit 0"), none = Shell("exit 0");
    named.tracer = kTracer;
    StatusOr<pid_t> a = set.Spawn(named), b = set.Spawn(none);
    if (!a.ok() || !b.ok()) ::_exit(3);
    if (!dslaunch::testing::RunUntil(
            io, [&] { return rec.exits.count(*a) && rec.exits.count(*b); }))
      ::_exit(4);
    if (rec.exits[*a].signal != SIGSYS) ::_exit(5);
    ::_exit(rec.exits[*b].signal == 0 && rec.exits[*b].exit_code == 0 ? 0 : 6);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(tester, &status, 0), tester);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0)
      << "2: no seccomp here, 3: spawn failed, 4: no exit seen, 5: the "
         "tracer was not named, 6: a child without one named one";
}

TEST(ChildReaper, IsOnePerLoop) {
  asio::io_context io;
  EXPECT_EQ(&ChildReaper::Of(io), &ChildReaper::Of(io));
}

TEST(ProcessSet, DestroyingTheSetKillsItsChildrenAndTheyAreStillReaped) {
  asio::io_context io;
  Recorder rec;
  pid_t pid = -1;
  {
    ProcessSet set(io, &rec);
    StatusOr<pid_t> spawned = set.Spawn(Shell("exec sleep 30"));
    ASSERT_TRUE(spawned.ok());
    pid = *spawned;
  }
  // No report (the owner is gone), but no zombie left behind either.
  ASSERT_TRUE(RunUntil(io, [&] { return StatField(pid, 3).empty(); }));
  EXPECT_TRUE(rec.exits.empty());
}

}  // namespace
}  // namespace dslaunch::base
