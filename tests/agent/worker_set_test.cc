#include "agent/worker_set.h"

#include <gtest/gtest.h>
#include <signal.h>    // SIGKILL, SIGTERM
#include <stdlib.h>    // mkdtemp
#include <sys/stat.h>  // chmod, mkdir
#include <unistd.h>    // getpgid, getpgrp

#include <boost/asio/io_context.hpp>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include "tests/common/run_until.h"

namespace dslaunch::agent {
namespace {

namespace asio = boost::asio;

using dslaunch::testing::RunUntil;

struct Event {
  bool is_exit = false;
  int rank = 0;
  // Output
  bool is_stderr = false;
  std::string line;
  bool partial = false;
  // Exit
  pid_t pid = 0;
  ExitInfo info;
};

class RecordingDelegate : public WorkerSet::Delegate {
 public:
  void OnWorkerOutput(int rank, bool is_stderr, std::string line,
                      bool partial) override {
    Event e;
    e.rank = rank;
    e.is_stderr = is_stderr;
    e.line = std::move(line);
    e.partial = partial;
    events.push_back(std::move(e));
  }
  void OnWorkerExited(int rank, pid_t pid, const ExitInfo& info) override {
    Event e;
    e.is_exit = true;
    e.rank = rank;
    e.pid = pid;
    e.info = info;
    events.push_back(std::move(e));
  }

  size_t exits() const {
    size_t n = 0;
    for (const Event& e : events) n += e.is_exit;
    return n;
  }
  const Event* ExitOf(int rank) const {
    for (const Event& e : events) {
      if (e.is_exit && e.rank == rank) return &e;
    }
    return nullptr;
  }
  // Output lines of `rank` on one stream, in order.
  std::vector<std::string> Lines(int rank, bool is_stderr) const {
    std::vector<std::string> out;
    for (const Event& e : events) {
      if (!e.is_exit && e.rank == rank && e.is_stderr == is_stderr) {
        out.push_back(e.line);
      }
    }
    return out;
  }
  bool HasLine(const std::string& line) const {
    for (const Event& e : events) {
      if (!e.is_exit && e.line == line) return true;
    }
    return false;
  }

  std::vector<Event> events;
};

// A scratch directory removed at the end of the test.
class TempDir {
 public:
  TempDir() {
    char tmpl[] = "/tmp/dsl-worker-test-XXXXXX";
    path_ = ::mkdtemp(tmpl);
  }
  ~TempDir() { std::filesystem::remove_all(path_); }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// True while `pid` exists and is not a zombie.
bool IsLive(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string stat((std::istreambuf_iterator<char>(in)),
                   std::istreambuf_iterator<char>());
  const size_t paren = stat.rfind(')');
  return paren != std::string::npos && paren + 2 < stat.size() &&
         stat[paren + 2] != 'Z';
}

void WriteFile(const std::string& path, const std::string& text, int mode) {
  std::ofstream(path) << text;
  ASSERT_EQ(::chmod(path.c_str(), mode), 0) << path;
}

class WorkerSetTest : public ::testing::Test {
 protected:
  WorkerSpec Shell(int rank, const std::string& script) {
    WorkerSpec spec;
    spec.rank = rank;
    spec.argv = {"/bin/sh", "-c", script};
    spec.env = {"PATH=/usr/bin:/bin"};
    return spec;
  }
  pid_t SpawnOk(const WorkerSpec& spec) {
    StatusOr<pid_t> pid = set_.Spawn(spec);
    EXPECT_TRUE(pid.ok()) << pid.status().message();
    return pid.ok() ? *pid : -1;
  }
  bool WaitForExits(size_t n) {
    return RunUntil(io_, [&] { return delegate_.exits() >= n; });
  }

  asio::io_context io_;
  RecordingDelegate delegate_;
  WorkerSet set_{io_, &delegate_};
};

TEST_F(WorkerSetTest, RelaysStdoutAndStderrLinesAndExitCode) {
  const pid_t pid =
      SpawnOk(Shell(5, "echo out; echo err >&2; printf tail; exit 3"));
  ASSERT_GT(pid, 0);
  EXPECT_EQ(set_.unfinished(), 1u);
  ASSERT_TRUE(WaitForExits(1));

  EXPECT_EQ(delegate_.Lines(5, false),
            (std::vector<std::string>{"out", "tail"}));
  EXPECT_EQ(delegate_.Lines(5, true), (std::vector<std::string>{"err"}));
  for (const Event& e : delegate_.events) {
    if (e.is_exit) continue;
    EXPECT_EQ(e.partial, e.line == "tail") << e.line;
  }
  const Event* exit = delegate_.ExitOf(5);
  ASSERT_NE(exit, nullptr);
  EXPECT_EQ(exit->pid, pid);
  EXPECT_EQ(exit->info.exit_code, 3);
  EXPECT_EQ(exit->info.signal, 0);
  EXPECT_EQ(exit->info.error, "");
  EXPECT_EQ(set_.unfinished(), 0u);
}

TEST_F(WorkerSetTest, ReportsExitAfterAllOutput) {
  SpawnOk(Shell(0, "echo first; seq 1 20000; echo to-err >&2; printf last"));
  ASSERT_TRUE(WaitForExits(1));
  ASSERT_FALSE(delegate_.events.empty());
  EXPECT_TRUE(delegate_.events.back().is_exit);
  const std::vector<std::string> out = delegate_.Lines(0, false);
  ASSERT_EQ(out.size(), 20002u);
  EXPECT_EQ(out.front(), "first");
  for (int i = 1; i <= 20000; ++i) ASSERT_EQ(out[i], std::to_string(i));
  EXPECT_EQ(out.back(), "last");
  EXPECT_EQ(delegate_.Lines(0, true), (std::vector<std::string>{"to-err"}));
  EXPECT_EQ(delegate_.ExitOf(0)->info.exit_code, 0);
}

TEST_F(WorkerSetTest, ReportsZeroExitForASuccessfulWorker) {
  SpawnOk(Shell(1, "true"));
  ASSERT_TRUE(WaitForExits(1));
  EXPECT_EQ(delegate_.events.size(), 1u);
  EXPECT_EQ(delegate_.ExitOf(1)->info.exit_code, 0);
  EXPECT_EQ(delegate_.ExitOf(1)->info.signal, 0);
}

TEST_F(WorkerSetTest, SignalAllSigkillReportsSignal9) {
  SpawnOk(Shell(2, "echo ready; sleep 30"));
  ASSERT_TRUE(RunUntil(io_, [&] { return delegate_.HasLine("ready"); }));
  set_.SignalAll(SIGKILL);
  ASSERT_TRUE(WaitForExits(1));
  const Event* exit = delegate_.ExitOf(2);
  ASSERT_NE(exit, nullptr);
  EXPECT_EQ(exit->info.signal, 9);
  EXPECT_EQ(exit->info.error, "");
  EXPECT_EQ(set_.unfinished(), 0u);
}

TEST_F(WorkerSetTest, SignalAllSigtermReachesEveryWorker) {
  for (int rank = 0; rank < 3; ++rank) {
    SpawnOk(Shell(rank, "echo ready; exec sleep 30"));
  }
  ASSERT_TRUE(RunUntil(io_, [&] {
    return delegate_.Lines(0, false).size() + delegate_.Lines(1, false).size() +
               delegate_.Lines(2, false).size() ==
           3;
  }));
  set_.SignalAll(SIGTERM);
  ASSERT_TRUE(WaitForExits(3));
  for (int rank = 0; rank < 3; ++rank) {
    ASSERT_NE(delegate_.ExitOf(rank), nullptr) << rank;
    EXPECT_EQ(delegate_.ExitOf(rank)->info.signal, SIGTERM) << rank;
  }
}

TEST_F(WorkerSetTest, MissingProgramReportsExit127AndCommandNotFound) {
  WorkerSpec spec;
  spec.rank = 4;
  spec.argv = {"dslaunch-test-no-such-program", "--flag"};
  spec.env = {"PATH=/usr/bin:/bin"};
  const pid_t pid = SpawnOk(spec);
  EXPECT_GT(pid, 0);
  ASSERT_TRUE(WaitForExits(1));
  const Event* exit = delegate_.ExitOf(4);
  ASSERT_NE(exit, nullptr);
  EXPECT_EQ(exit->pid, pid);
  EXPECT_EQ(exit->info.exit_code, 127);
  EXPECT_EQ(exit->info.signal, 0);
  EXPECT_NE(exit->info.error.find("command not found"), std::string::npos)
      << exit->info.error;
}

TEST_F(WorkerSetTest, NonExecutableFileReportsCannotExecute) {
  TempDir dir;
  const std::string path = dir.path() + "/not-executable";
  WriteFile(path, "#!/bin/sh\necho hi\n", 0644);
  WorkerSpec spec;
  spec.argv = {path};
  spec.env = {"PATH=/usr/bin:/bin"};
  SpawnOk(spec);
  ASSERT_TRUE(WaitForExits(1));
  const Event* exit = delegate_.ExitOf(0);
  EXPECT_EQ(exit->info.exit_code, 127);
  EXPECT_NE(exit->info.error.find("cannot execute '" + path + "'"),
            std::string::npos)
      << exit->info.error;
  EXPECT_FALSE(delegate_.HasLine("hi"));
}

TEST_F(WorkerSetTest, MissingWorkingDirectoryReportsCannotChangeDirectory) {
  WorkerSpec spec = Shell(0, "echo ran");
  spec.cwd = "/nonexistent-dslaunch-test-dir";
  SpawnOk(spec);
  ASSERT_TRUE(WaitForExits(1));
  const Event* exit = delegate_.ExitOf(0);
  EXPECT_EQ(exit->info.exit_code, 127);
  EXPECT_NE(exit->info.error.find("cannot change directory"), std::string::npos)
      << exit->info.error;
  EXPECT_FALSE(delegate_.HasLine("ran"));
}

TEST_F(WorkerSetTest, EmptyArgvIsRejected) {
  WorkerSpec spec;
  StatusOr<pid_t> pid = set_.Spawn(spec);
  ASSERT_FALSE(pid.ok());
  EXPECT_EQ(pid.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(set_.unfinished(), 0u);
}

TEST_F(WorkerSetTest, WorkerRunsInItsOwnProcessGroup) {
  const pid_t pid = SpawnOk(Shell(0, "echo ready; sleep 30 & echo $!; wait"));
  ASSERT_TRUE(
      RunUntil(io_, [&] { return delegate_.Lines(0, false).size() == 2; }));
  EXPECT_EQ(::getpgid(pid), pid);
  EXPECT_NE(::getpgrp(), pid);
  // A grandchild shares the group, so SignalAll reaches it too.
  const pid_t grandchild = std::stoi(delegate_.Lines(0, false)[1]);
  EXPECT_EQ(::getpgid(grandchild), pid);
  set_.SignalAll(SIGKILL);
  ASSERT_TRUE(WaitForExits(1));
  EXPECT_EQ(delegate_.ExitOf(0)->info.signal, SIGKILL);
}

// The grandchild leaves the worker's process group (setsid), so the kill of
// the group at the reap does not reach it: it still holds stdout open when
// the worker exits, and only the drain period after the reap can report the
// exit. (This test used to run `sleep 30 &` in the worker's own group, which
// the reap kills at once: the pipe closed by end of file and the test passed
// even with the drain timer removed.)
TEST_F(WorkerSetTest, ReportsExitEvenIfAGrandchildKeepsTheOutputOpen) {
  // The worker exits once the grandchild is in its own session (field 6 of
  // /proc/<pid>/stat), so the kill of the worker's group cannot reach it.
  SpawnOk(
      Shell(0,
            "setsid sleep 30 & g=$!; "
            "until [ \"$(cut -d' ' -f6 /proc/$g/stat)\" = $g ]; do :; done; "
            "echo $g; exit 4"));
  ASSERT_TRUE(
      RunUntil(io_, [&] { return delegate_.Lines(0, false).size() == 1; }));
  const pid_t grandchild = std::stoi(delegate_.Lines(0, false)[0]);
  bool grandchild_alive_at_exit = false;
  const bool exited = RunUntil(
      io_,
      [&] {
        if (delegate_.exits() == 0) return false;
        grandchild_alive_at_exit = IsLive(grandchild);
        return true;
      },
      std::chrono::seconds(8));
  ::kill(grandchild, SIGKILL);
  ASSERT_TRUE(exited);
  EXPECT_TRUE(grandchild_alive_at_exit)
      << "the pipe reached end of file: the drain period was not tested";
  EXPECT_EQ(delegate_.ExitOf(0)->info.exit_code, 4);
  EXPECT_EQ(delegate_.Lines(0, false).size(), 1u);
  EXPECT_EQ(set_.unfinished(), 0u);
}

TEST_F(WorkerSetTest, WorkerGetsExactlyTheGivenEnvironmentAndWorkingDirectory) {
  TempDir dir;
  WorkerSpec spec = Shell(0, "echo \"$FOO\"; echo \"${HOME-unset}\"; pwd -P");
  spec.env = {"PATH=/usr/bin:/bin", "FOO=bar baz"};
  spec.cwd = dir.path();
  SpawnOk(spec);
  ASSERT_TRUE(WaitForExits(1));
  EXPECT_EQ(delegate_.Lines(0, false),
            (std::vector<std::string>{
                "bar baz", "unset",
                std::filesystem::canonical(dir.path()).string()}));
}

TEST_F(WorkerSetTest, PassesArgumentsWithoutAShell) {
  TempDir dir;
  const std::string script = dir.path() + "/args.sh";
  WriteFile(script, "#!/bin/sh\nfor a in \"$@\"; do echo \"[$a]\"; done\n",
            0755);
  WorkerSpec spec;
  spec.argv = {script, "a b", "$HOME", "'q'", ""};
  spec.env = {"PATH=/usr/bin:/bin"};
  SpawnOk(spec);
  ASSERT_TRUE(WaitForExits(1));
  EXPECT_EQ(delegate_.Lines(0, false),
            (std::vector<std::string>{"[a b]", "[$HOME]", "['q']", "[]"}));
}

TEST_F(WorkerSetTest, FindsProgramInTheWorkersPath) {
  SpawnOk([] {
    WorkerSpec spec;
    spec.argv = {"sh", "-c", "echo found"};
    spec.env = {"PATH=/nonexistent:/bin:/usr/bin"};
    return spec;
  }());
  ASSERT_TRUE(WaitForExits(1));
  EXPECT_EQ(delegate_.Lines(0, false), (std::vector<std::string>{"found"}));
  EXPECT_EQ(delegate_.ExitOf(0)->info.exit_code, 0);
}

TEST_F(WorkerSetTest, StdinIsEmpty) {
  SpawnOk(Shell(0, "cat; echo done"));
  ASSERT_TRUE(WaitForExits(1));
  EXPECT_EQ(delegate_.Lines(0, false), (std::vector<std::string>{"done"}));
}

TEST_F(WorkerSetTest, TracksSeveralWorkersByRank) {
  std::vector<pid_t> pids;
  for (int rank = 0; rank < 4; ++rank) {
    pids.push_back(
        SpawnOk(Shell(rank, "echo rank-" + std::to_string(rank) + "; exit " +
                                std::to_string(10 + rank))));
  }
  EXPECT_EQ(set_.unfinished(), 4u);
  ASSERT_TRUE(WaitForExits(4));
  EXPECT_EQ(set_.unfinished(), 0u);
  for (int rank = 0; rank < 4; ++rank) {
    EXPECT_EQ(delegate_.Lines(rank, false),
              (std::vector<std::string>{"rank-" + std::to_string(rank)}));
    const Event* exit = delegate_.ExitOf(rank);
    ASSERT_NE(exit, nullptr);
    EXPECT_EQ(exit->pid, pids[rank]);
    EXPECT_EQ(exit->info.exit_code, 10 + rank);
  }
}

TEST_F(WorkerSetTest, PausedOutputIsDeliveredAfterResumeBeforeTheExit) {
  set_.PauseOutput();
  const pid_t pid = SpawnOk(Shell(0, "echo held; printf partial"));
  // Wait until the worker has been reaped (gone from /proc): all its output
  // is written, and still nothing may be reported while paused.
  ASSERT_TRUE(RunUntil(io_, [&] {
    return !std::filesystem::exists("/proc/" + std::to_string(pid));
  }));
  EXPECT_TRUE(delegate_.events.empty());
  set_.ResumeOutput();
  ASSERT_TRUE(WaitForExits(1));
  ASSERT_EQ(delegate_.events.size(), 3u);
  EXPECT_EQ(delegate_.events[0].line, "held");
  EXPECT_EQ(delegate_.events[1].line, "partial");
  EXPECT_TRUE(delegate_.events[1].partial);
  EXPECT_TRUE(delegate_.events[2].is_exit);
}

TEST(ResolveProgram, FindsExecutableInPathOrder) {
  TempDir first, second;
  WriteFile(first.path() + "/tool", "#!/bin/sh\n", 0644);  // not executable
  WriteFile(second.path() + "/tool", "#!/bin/sh\n", 0755);
  StatusOr<std::string> found = ResolveProgram(
      "tool", "/nonexistent:" + first.path() + ":" + second.path());
  ASSERT_TRUE(found.ok()) << found.status().message();
  EXPECT_EQ(*found, second.path() + "/tool");
}

TEST(ResolveProgram, PrefersTheFirstMatchInPath) {
  TempDir first, second;
  WriteFile(first.path() + "/tool", "#!/bin/sh\n", 0755);
  WriteFile(second.path() + "/tool", "#!/bin/sh\n", 0755);
  StatusOr<std::string> found =
      ResolveProgram("tool", first.path() + ":" + second.path());
  ASSERT_TRUE(found.ok());
  EXPECT_EQ(*found, first.path() + "/tool");
}

TEST(ResolveProgram, FindsShInBin) {
  StatusOr<std::string> found = ResolveProgram("sh", "/bin");
  ASSERT_TRUE(found.ok());
  EXPECT_EQ(*found, "/bin/sh");
}

TEST(ResolveProgram, TakesNameWithSlashAsIs) {
  StatusOr<std::string> found = ResolveProgram("./no/such/tool", "/bin");
  ASSERT_TRUE(found.ok());
  EXPECT_EQ(*found, "./no/such/tool");
}

// Under Yama's ptrace_scope 1 a rank's declared tracer and that tracer's
// descendants may trace it: naming the agent, of which every rank descends,
// would let the ranks of a job trace each other. A rank names the tracer it
// is given (the stack helper) and nobody else.
TEST(WorkerProcessSpec, NamesTheGivenTracerNeverTheAgent) {
  WorkerSpec spec;
  spec.argv = {"/bin/true"};
  spec.tracer = 4242;
  EXPECT_EQ(WorkerProcessSpec(spec, "").tracer, 4242);
  spec.tracer = 0;
  EXPECT_EQ(WorkerProcessSpec(spec, "").tracer, 0);  // none: nobody
  EXPECT_EQ(WorkerProcessSpec(spec, "/sys/fs/cgroup/job").cgroup_dir,
            "/sys/fs/cgroup/job");
}

TEST(ResolveProgram, ReportsCommandNotFound) {
  StatusOr<std::string> found =
      ResolveProgram("dslaunch-test-no-such-program", "/bin:/usr/bin");
  ASSERT_FALSE(found.ok());
  EXPECT_EQ(found.status().code(), StatusCode::kNotFound);
  EXPECT_NE(found.status().message().find(
                "command not found: dslaunch-test-no-such-program"),
            std::string::npos);
}

TEST(ResolveProgram, RejectsEmptyName) {
  EXPECT_EQ(ResolveProgram("", "/bin").status().code(),
            StatusCode::kInvalidArgument);
}

// execvp skips a PATH entry whose match is a directory and goes on
// searching; so does ResolveProgram (access(X_OK) alone would accept it).
TEST(ResolveProgram, SkipsDirectoryWithTheProgramsName) {
  TempDir first, second;
  ASSERT_EQ(::mkdir((first.path() + "/tool").c_str(), 0755), 0);
  WriteFile(second.path() + "/tool", "#!/bin/sh\n", 0755);
  StatusOr<std::string> found =
      ResolveProgram("tool", first.path() + ":" + second.path());
  ASSERT_TRUE(found.ok());
  EXPECT_EQ(*found, second.path() + "/tool");
}

}  // namespace
}  // namespace dslaunch::agent
