#include "agent/rank_monitor.h"

#include <fcntl.h>  // open
#include <gtest/gtest.h>
#include <signal.h>    // SIGKILL
#include <spawn.h>     // posix_spawn
#include <stdlib.h>    // mkdtemp
#include <sys/stat.h>  // mkfifo
#include <sys/wait.h>  // waitpid
#include <unistd.h>

#include <boost/asio/io_context.hpp>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "tests/common/child_process.h"
#include "tests/common/run_until.h"

extern char** environ;

namespace dslaunch::agent {
namespace {

namespace asio = boost::asio;
using dslaunch::testing::RunUntil;
using std::chrono::milliseconds;

// `sleep 60`, started (and alone killed and reaped) by this test.
struct Sleeper : dslaunch::testing::ChildProcess {
  Sleeper() : ChildProcess({"sleep", "60"}) {}
};

class RankMonitorTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/dsl-monitor-test-XXXXXX";
    dir_ = ::mkdtemp(tmpl);
  }
  void TearDown() override {
    monitor_.reset();
    std::filesystem::remove_all(dir_);
  }
  void Make(RankMonitorOptions o = {}) {
    o.stats_interval = milliseconds(50);
    if (o.oom.kmsg_path == "/dev/kmsg") o.oom.kmsg_path = dir_ + "/no-kmsg";
    if (o.stacks.path_env.empty()) o.stacks.path_env = dir_;  // no tools
    o.stacks.argv = {DSL_DSAGENT, kStackHelperFlag};
    monitor_ = std::make_unique<RankMonitor>(
        io_, [this](const wire::Envelope& e) { sent_.push_back(e); }, o);
  }
  size_t Count(wire::Envelope::MsgCase kind) const {
    size_t n = 0;
    for (const auto& e : sent_) n += e.msg_case() == kind;
    return n;
  }
  const wire::Envelope* Last(wire::Envelope::MsgCase kind) const {
    for (auto it = sent_.rbegin(); it != sent_.rend(); ++it)
      if (it->msg_case() == kind) return &*it;
    return nullptr;
  }
  // The messages of one kind, in the order sent (rank stats arrive every
  // 50 ms between them).
  std::vector<wire::Envelope> All(wire::Envelope::MsgCase kind) const {
    std::vector<wire::Envelope> out;
    for (const auto& e : sent_)
      if (e.msg_case() == kind) out.push_back(e);
    return out;
  }

  asio::io_context io_;
  std::string dir_;
  std::unique_ptr<RankMonitor> monitor_;
  std::vector<wire::Envelope> sent_;
};

TEST_F(RankMonitorTest, ResidentBytesOfALiveProcess) {
  EXPECT_GT(ResidentBytes(::getpid()), 1 << 20);
  EXPECT_EQ(ResidentBytes(-5), -1);
}

TEST_F(RankMonitorTest, SendsRankStatsWhileRanksRunAndStopsAfter) {
  Sleeper s;
  Make();
  monitor_->OnStarted(3, s.pid(), dir_ + "/error-3.json", "");
  ASSERT_TRUE(
      RunUntil(io_, [&] { return Count(wire::Envelope::kRankStats) >= 2; }));
  const auto& stats = Last(wire::Envelope::kRankStats)->rank_stats();
  ASSERT_EQ(stats.entries_size(), 1);
  EXPECT_EQ(stats.entries(0).rank(), 3);
  EXPECT_GT(stats.entries(0).rss_bytes(), 0);
  EXPECT_GT(stats.time(), 1.7e9);
  wire::WorkerExited exited;
  monitor_->OnExited(3, base::ExitInfo{}, &exited);
  const size_t before = Count(wire::Envelope::kRankStats);
  RunUntil(
      io_, [] { return false; }, milliseconds(200));
  EXPECT_EQ(Count(wire::Envelope::kRankStats), before);  // none running
}

TEST_F(RankMonitorTest, ReadsTheErrorFileOfAFailedRankOnly) {
  Make();
  std::ofstream(dir_ + "/error-1.json") << "{\"message\": \"boom\"}";
  std::ofstream(dir_ + "/error-2.json") << "{\"message\": \"ok?\"}";
  monitor_->OnStarted(1, 1001, dir_ + "/error-1.json", "");
  monitor_->OnStarted(2, 1002, dir_ + "/error-2.json", "");
  wire::WorkerExited failed, fine;
  base::ExitInfo code1;
  code1.exit_code = 1;
  monitor_->OnExited(1, code1, &failed);
  monitor_->OnExited(2, base::ExitInfo{}, &fine);
  EXPECT_EQ(failed.error_file(), "{\"message\": \"boom\"}");
  EXPECT_EQ(fine.error_file(), "");
  EXPECT_FALSE(failed.oom_killed());
}

TEST_F(RankMonitorTest, AnUnsentSigkillIsMatchedToTheKernelLog) {
  const std::string kmsg = dir_ + "/kmsg";
  ASSERT_EQ(::mkfifo(kmsg.c_str(), 0600), 0);
  RankMonitorOptions o;
  o.oom.kmsg_path = kmsg;
  Make(o);
  monitor_->OnStarted(0, 4321, dir_ + "/error-0.json", "");
  monitor_->OnStarted(1, 4322, dir_ + "/error-1.json", "");
  const int w = ::open(kmsg.c_str(), O_WRONLY | O_NONBLOCK);
  ASSERT_GE(w, 0);
  const std::string rec =
      "3,812,2239183022,-;Out of memory: Killed process 4321 (python3) "
      "total-vm:1082676kB, anon-rss:964352kB, file-rss:0kB, shmem-rss:0kB, "
      "UID:0 pgtables:2252kB oom_score_adj:0\n";
  ASSERT_EQ(::write(w, rec.data(), rec.size()),
            static_cast<ssize_t>(rec.size()));
  ::close(w);
  base::ExitInfo killed;
  killed.signal = SIGKILL;
  wire::WorkerExited e0, e1;
  base::ExitInfo stopped = killed;
  stopped.signalled = true;  // the agent's own SIGKILL: never asked
  monitor_->OnExited(1, stopped, &e1);
  monitor_->OnExited(0, killed, &e0);
  EXPECT_TRUE(e0.oom_killed());
  EXPECT_EQ(e0.oom_detail().rfind("kernel log: Out of memory: Killed process "
                                  "4321 (python3) total-vm:1082676kB",
                                  0),
            0u);
  EXPECT_FALSE(e1.oom_killed());
  EXPECT_EQ(e1.oom_detail(), "");
}

TEST_F(RankMonitorTest, StacksOfARankNotRunningOrOfAnotherNode) {
  Sleeper s;
  Make();
  monitor_->OnStarted(4, s.pid(), dir_ + "/error-4.json", "");
  monitor_->OnStarted(5, 1005, dir_ + "/error-5.json", "");
  wire::WorkerExited e;
  monitor_->OnExited(5, base::ExitInfo{}, &e);
  wire::CollectStacks req;
  req.add_ranks(5);
  req.add_ranks(9);  // not this node's
  req.add_ranks(4);
  req.set_reason("hang: no progress for 600 s");
  monitor_->HandleCollectStacks(req);
  ASSERT_TRUE(RunUntil(
      io_, [&] { return Count(wire::Envelope::kStacks) >= 2; },
      milliseconds(10000)));
  const auto stacks = All(wire::Envelope::kStacks);
  ASSERT_EQ(stacks.size(), 2u);
  EXPECT_EQ(stacks[0].stacks().rank(), 5);
  EXPECT_EQ(stacks[0].stacks().error(), "rank 5 is not running");
  EXPECT_EQ(stacks[1].stacks().rank(), 4);  // no tool in this PATH
  EXPECT_EQ(stacks[1].stacks().error(),
            "no stack tool found (install elfutils or gdb)");
}

}  // namespace
}  // namespace dslaunch::agent
