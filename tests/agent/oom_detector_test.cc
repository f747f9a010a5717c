#include "agent/oom_detector.h"

#include <fcntl.h>  // open
#include <gtest/gtest.h>
#include <stdlib.h>    // mkdtemp
#include <sys/stat.h>  // mkfifo
#include <unistd.h>    // write

#include <filesystem>
#include <fstream>
#include <string>

namespace dslaunch::agent {
namespace {

// Records as /dev/kmsg gives them (Linux 6.x, a memory cgroup OOM kill).
constexpr char kKilled[] =
    "3,8812,22391830224,-;Memory cgroup out of memory: Killed process 4321 "
    "(python3) total-vm:1082676kB, anon-rss:64352kB, file-rss:4096kB, "
    "shmem-rss:0kB, UID:0 pgtables:252kB oom_score_adj:0\n";
constexpr char kSummary[] =
    "6,8811,22391830190,-;oom-kill:constraint=CONSTRAINT_MEMCG,"
    "nodemask=(null),cpuset=/,mems_allowed=0,oom_memcg=/dsl-oom,"
    "task_memcg=/dsl-oom/dsl-job-0-77,task=python3,pid=4321,uid=0\n";
constexpr char kGlobal[] =
    "3,120,5123456,-;Out of memory: Killed process 14321 (python3) "
    "total-vm:9000000kB, anon-rss:8000000kB, file-rss:0kB, shmem-rss:0kB, "
    "UID:1000 pgtables:16000kB oom_score_adj:0\n SUBSYSTEM=memory\n";
constexpr char kOther[] =
    "6,8813,22391830300,-;dslbr0: port 1(veth0) entered disabled state\n";

TEST(OomKillMessage, MatchesTheKilledProcessLineOfThatPid) {
  EXPECT_EQ(OomKillMessage(kKilled, 4321),
            "Memory cgroup out of memory: Killed process 4321 (python3) "
            "total-vm:1082676kB, anon-rss:64352kB, file-rss:4096kB, "
            "shmem-rss:0kB, UID:0 pgtables:252kB oom_score_adj:0");
  EXPECT_EQ(OomKillMessage(kKilled, 432), "");
  EXPECT_EQ(OomKillMessage(kKilled, 321), "");
}

TEST(OomKillMessage, MatchesTheOomKillSummaryOfThatPid) {
  EXPECT_NE(OomKillMessage(kSummary, 4321), "");
  EXPECT_EQ(OomKillMessage(kSummary, 432), "");
  EXPECT_EQ(OomKillMessage(kSummary, 21), "");
}

TEST(OomKillMessage, TakesTheFirstLineOnlyAndNoOtherRecords) {
  EXPECT_EQ(OomKillMessage(kGlobal, 14321).find("SUBSYSTEM"),
            std::string::npos);
  EXPECT_EQ(OomKillMessage(kGlobal, 4321), "");
  EXPECT_EQ(OomKillMessage(kOther, 1), "");
  EXPECT_TRUE(IsOomKillRecord(kKilled));
  EXPECT_TRUE(IsOomKillRecord(kSummary));
  EXPECT_FALSE(IsOomKillRecord(kOther));
  EXPECT_FALSE(IsOomKillRecord("no semicolon Killed process 1 ("));
}

TEST(OomKillCount, ReadsTheCounterOfMemoryEvents) {
  EXPECT_EQ(OomKillCount("low 0\nhigh 0\nmax 31\noom 2\noom_kill 1\n"
                         "oom_group_kill 0\n"),
            1);
  EXPECT_EQ(OomKillCount("oom_group_kill 5\noom_kill 12"), 12);
  EXPECT_EQ(OomKillCount("low 0\nhigh 0\n"), -1);
  EXPECT_EQ(OomKillCount(""), -1);
  EXPECT_EQ(OomKillCount("oom_kill x\n"), -1);
}

TEST(DescribeMemoryMax, SaysTheLimitInUnits) {
  EXPECT_EQ(DescribeMemoryMax("67108864\n"), "64 MiB");
  EXPECT_EQ(DescribeMemoryMax("2147483648\n"), "2 GiB");
  EXPECT_EQ(DescribeMemoryMax("1000\n"), "1000 bytes");
  EXPECT_EQ(DescribeMemoryMax("max\n"), "max");
}

class OomDetectorTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/dsl-oom-test-XXXXXX";
    root_ = ::mkdtemp(tmpl);
    job_ = root_ + "/limited/dsl-job-0-77";
    std::filesystem::create_directories(job_);
    SetEvents(0);
    std::ofstream(root_ + "/limited/memory.max") << "67108864\n";
  }
  void TearDown() override { std::filesystem::remove_all(root_); }
  void SetEvents(int oom_kills) {
    std::ofstream(root_ + "/limited/memory.events")
        << "low 0\nhigh 0\nmax 3\noom 1\noom_kill " << oom_kills << "\n";
  }
  std::string root_, job_;
};

TEST_F(OomDetectorTest, FindsTheNearestCgroupWithMemoryEvents) {
  EXPECT_EQ(MemoryEventsDir(job_, root_), root_ + "/limited");
  EXPECT_EQ(MemoryEventsDir(root_ + "/limited", root_), root_ + "/limited");
  EXPECT_EQ(MemoryEventsDir(root_ + "/elsewhere", root_), "");
  EXPECT_EQ(MemoryEventsDir(job_, ""), "");
}

TEST_F(OomDetectorTest, TellsByTheCgroupCounterWithoutAKernelLog) {
  OomDetector oom({.kmsg_path = root_ + "/no-kmsg", .cgroup_mount = root_});
  oom.NoteSpawned(0, job_);
  oom.NoteSpawned(1, job_);
  EXPECT_FALSE(oom.Explain(0, 4321).has_value());  // counter unchanged
  SetEvents(1);
  auto why = oom.Explain(1, 4322);
  ASSERT_TRUE(why.has_value());
  // The counter is the job cgroup's parent's: another process below it may
  // have been the one killed, and the report says so.
  EXPECT_EQ(*why, "probably: oom-kill in " + root_ +
                      "/limited (memory.max 64 MiB), the job's cgroup or one "
                      "above it; the kernel log (which names the process) "
                      "was not readable");
}

TEST_F(OomDetectorTest, TheJobsOwnCgroupCounterIsCertain) {
  OomDetector oom({.kmsg_path = root_ + "/no-kmsg", .cgroup_mount = root_});
  const std::string limited = root_ + "/limited";
  oom.NoteSpawned(0, limited);
  SetEvents(1);
  auto why = oom.Explain(0, 4321);
  ASSERT_TRUE(why.has_value());
  EXPECT_EQ(*why, "oom-kill in " + limited + " (memory.max 64 MiB)");
}

TEST_F(OomDetectorTest, TellsByTheKernelLogFromWhenTheJobStarted) {
  // A FIFO stands in for /dev/kmsg: one write is one record.
  const std::string kmsg = root_ + "/kmsg";
  ASSERT_EQ(::mkfifo(kmsg.c_str(), 0600), 0);
  OomDetector oom({.kmsg_path = kmsg, .cgroup_mount = root_});
  oom.NoteSpawned(0, job_);  // opens it (for reading, not blocking)
  const int w = ::open(kmsg.c_str(), O_WRONLY | O_NONBLOCK);
  ASSERT_GE(w, 0);
  ASSERT_EQ(::write(w, kKilled, sizeof(kKilled) - 1),
            static_cast<ssize_t>(sizeof(kKilled) - 1));
  auto why = oom.Explain(0, 4321);
  ASSERT_TRUE(why.has_value());
  EXPECT_EQ(why->rfind("kernel log: Memory cgroup out of memory: Killed "
                       "process 4321 (python3) total-vm:1082676kB",
                       0),
            0u)
      << *why;
  // Kept for the next rank asking; another pid is not matched.
  EXPECT_TRUE(oom.Explain(0, 4321).has_value());
  EXPECT_FALSE(oom.Explain(0, 4322).has_value());
  ::close(w);
}

TEST_F(OomDetectorTest, TheRealKernelLogDoesNotBlockOrBlameAnInnocentPid) {
  OomDetector oom;  // /dev/kmsg when readable, the agent's own cgroup
  oom.NoteSpawned(0, "");
  EXPECT_FALSE(oom.Explain(0, ::getpid()).has_value());
}

}  // namespace
}  // namespace dslaunch::agent
