#include "agent/job_containment.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <boost/asio/io_context.hpp>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "agent/worker_set.h"
#include "base/process_tree.h"
#include "tests/common/run_until.h"

namespace dslaunch::agent {
namespace {

using dslaunch::testing::RunUntil;

TEST(Cgroup2Mount, FindsTheCgroup2MountAmongOthers) {
  const std::string mountinfo =
      "25 1 0:23 / /sys rw,nosuid - sysfs sysfs rw\n"
      "31 25 0:27 / /sys/fs/cgroup ro shared:9 - tmpfs tmpfs ro,mode=755\n"
      "32 31 0:28 / /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory\n"
      "41 31 0:38 / /sys/fs/cgroup/unified rw,relatime shared:10 - cgroup2 "
      "cgroup2 rw\n";
  EXPECT_EQ(base::Cgroup2Mount(mountinfo), "/sys/fs/cgroup/unified");
}

TEST(Cgroup2Mount, IgnoresABindMountedSubtreeAndNoMountAtAll) {
  EXPECT_EQ(
      base::Cgroup2Mount("50 1 0:38 /job /mnt/cg rw - cgroup2 cgroup2 rw\n"),
      "");
  EXPECT_EQ(base::Cgroup2Mount("25 1 0:23 / /sys rw - sysfs sysfs rw\n"), "");
}

TEST(Cgroup2Path, TakesTheUnifiedLine) {
  EXPECT_EQ(base::Cgroup2Path("4:memory:/a\n0::/user.slice/x.scope\n"),
            "/user.slice/x.scope");
  EXPECT_EQ(base::Cgroup2Path("4:memory:/a\n"), "");
}

bool Contains(const std::vector<pid_t>& v, pid_t p) {
  return std::find(v.begin(), v.end(), p) != v.end();
}

// A child of ours that has a child of its own; both wait for a signal.
struct SmallTree {
  pid_t child = -1;
  pid_t grandchild = -1;
  SmallTree() {
    int fds[2];
    if (::pipe(fds) != 0) return;
    child = ::fork();
    if (child == 0) {  // child: a grandchild, then tell its pid and wait
      const pid_t g = ::fork();
      if (g == 0) {
        ::pause();
        ::_exit(0);
      }
      (void)!::write(fds[1], &g, sizeof(g));
      ::pause();
      ::_exit(0);
    }
    if (::read(fds[0], &grandchild, sizeof(grandchild)) != sizeof(grandchild))
      grandchild = -1;
    ::close(fds[0]);
    ::close(fds[1]);
  }
  ~SmallTree() {
    if (grandchild > 0) ::kill(grandchild, SIGKILL);
    if (child > 0) {
      ::kill(child, SIGKILL);
      ::waitpid(child, nullptr, 0);
    }
  }
};

TEST(LiveDescendants, FindsChildrenAndGrandchildrenButNotOthers) {
  SmallTree tree;
  ASSERT_GT(tree.child, 0);
  ASSERT_GT(tree.grandchild, 0);
  const std::vector<pid_t> found = base::LiveDescendants(::getpid());
  const std::vector<pid_t> pruned =
      base::LiveDescendants(::getpid(), {tree.child});
  EXPECT_TRUE(Contains(found, tree.child));
  EXPECT_TRUE(Contains(found, tree.grandchild));
  EXPECT_FALSE(Contains(found, ::getpid()));
  EXPECT_FALSE(Contains(found, 1));
  EXPECT_FALSE(Contains(pruned, tree.child));
  EXPECT_FALSE(Contains(pruned, tree.grandchild));
}

TEST(SignalLiveDescendants, KillsTheTreeButNotWhatIsSkipped) {
  SmallTree spared, doomed;
  ASSERT_GT(spared.grandchild, 0);
  ASSERT_GT(doomed.grandchild, 0);
  EXPECT_EQ(base::SignalLiveDescendants(::getpid(), {spared.child}, SIGKILL),
            2);
  int status = 0;
  ASSERT_EQ(::waitpid(doomed.child, &status, 0), doomed.child);
  EXPECT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL);
  doomed.child = -1;
  // The grandchild went to init (or a subreaper): wait until it is dead.
  for (int i = 0; i < 500 && base::IsLiveProcess(doomed.grandchild); ++i) {
    ::usleep(2000);
  }
  EXPECT_FALSE(base::IsLiveProcess(doomed.grandchild));
  EXPECT_TRUE(base::IsLiveProcess(spared.child));
  EXPECT_TRUE(base::IsLiveProcess(spared.grandchild));
  // Nothing left below us but what is skipped: nothing more is signalled.
  EXPECT_EQ(base::SignalLiveDescendants(::getpid(), {spared.child}, SIGKILL),
            0);
}

class Recorder : public WorkerSet::Delegate {
 public:
  void OnWorkerOutput(int, bool, std::string line, bool) override {
    lines.push_back(line);
  }
  void OnWorkerExited(int rank, pid_t, const ExitInfo&) override {
    exited_ranks.push_back(rank);
  }
  std::vector<std::string> lines;
  std::vector<int> exited_ranks;
};

// True while /proc knows `pid` (a zombie still counts: not yet reaped).
bool Exists(pid_t pid) {
  return std::filesystem::exists("/proc/" + std::to_string(pid));
}

TEST(WorkerSetContainment, EscapedDescendantIsKilledAndReapedNeverReported) {
  boost::asio::io_context io;
  Recorder rec;
  pid_t escaped = -1;
  std::string cgroup;
  {
    WorkerSet set(io, &rec);
    set.Contain("unit-test", ::getpid());
    cgroup = set.containment().cgroup_dir();
    WorkerSpec spec;
    spec.rank = 3;
    spec.env = {"PATH=/usr/bin:/bin"};
    // The grandchild leaves the worker's group and session; the worker
    // waits until it has, tells its pid and exits.
    spec.argv = {"/bin/sh", "-c",
                 "setsid sleep 30 >/dev/null 2>&1 & g=$!; "
                 "until [ \"$(cut -d' ' -f6 /proc/$g/stat)\" = $g ]; do :; "
                 "done; echo $g"};
    ASSERT_TRUE(set.Spawn(spec).ok());
    ASSERT_TRUE(RunUntil(io, [&] { return rec.exited_ranks.size() == 1; }));
    escaped = std::stoi(rec.lines.at(0));
    ASSERT_TRUE(Exists(escaped));  // outlived its worker
    if (!cgroup.empty()) {         // and is in the job's cgroup
      std::ifstream procs(cgroup + "/cgroup.procs");
      std::string all((std::istreambuf_iterator<char>(procs)), {});
      EXPECT_NE(all.find(std::to_string(escaped)), std::string::npos);
    }
    set.KillDescendants();
    // Killed, then reaped by us (the subreaper): gone from /proc.
    EXPECT_TRUE(RunUntil(io, [&] { return !Exists(escaped); }));
    EXPECT_EQ(rec.exited_ranks, std::vector<int>{3});
  }
  if (!cgroup.empty()) {
    EXPECT_FALSE(std::filesystem::exists(cgroup));
  }
  ::prctl(PR_SET_CHILD_SUBREAPER, 0);
  if (Exists(escaped)) ::kill(escaped, SIGKILL);
}

}  // namespace
}  // namespace dslaunch::agent
