#include "launcher/start/ssh_starter.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>

#include "base/process_tree.h"

namespace dslaunch::launcher {
namespace {

// A child whose command line holds `word` as one argument, as an agent's
// holds its job id: sh -c 'read x' WORD. It waits on a pipe this process
// holds (so it ends with the test) and starts no process of its own that
// could outlive it holding the test's output open.
pid_t ChildWithWord(const std::string& word) {
  int fds[2];
  if (::pipe(fds) != 0) return -1;
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::dup2(fds[0], 0);
    ::close(fds[0]);
    ::close(fds[1]);
    ::execl("/bin/sh", "sh", "-c", "read x", word.c_str(),
            static_cast<char*>(nullptr));
    ::_exit(127);
  }
  ::close(fds[0]);  // the write end stays open until the test process ends
  std::this_thread::sleep_for(std::chrono::milliseconds(100));  // exec'd
  return pid;
}

// Whether the child ended by SIGKILL within a second (reaped either way).
bool KilledWithin1s(pid_t pid) {
  int status = 0;
  for (int i = 0; i < 100; ++i) {
    if (::waitpid(pid, &status, WNOHANG) == pid)
      return WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ::kill(pid, SIGKILL);
  ::waitpid(pid, &status, 0);
  return false;
}

// What the command prints (stdout), run by /bin/sh here.
std::string Output(const std::string& command) {
  std::string out;
  FILE* p = ::popen(command.c_str(), "r");
  if (!p) return out;
  char buf[256];
  while (std::fgets(buf, sizeof(buf), p)) out += buf;
  ::pclose(p);
  return out;
}

// The kill a frozen agent gets over a second SSH connection (or a pdsh or
// srun of its own): by pid, only where that pid still runs this job's agent;
// then it says that the agent is gone, which stands for the agent's end
// where the tool cannot report it.
TEST(KillAgentCommand, KillsThePidOnlyWhileItRunsTheJobsAgentThenSaysItIsGone) {
  const pid_t agent = ChildWithWord("0123abcd");
  ASSERT_GT(agent, 0);
  const pid_t other = ChildWithWord("0123abcd-not");
  ASSERT_GT(other, 0);
  const uint64_t started = base::ProcessStartTicks(agent);
  ASSERT_GT(started, 0u);
  EXPECT_EQ(Output(KillAgentCommand({agent, started}, "0123abcd")),
            std::string(kAgentGone) + " " + std::to_string(agent) + "\n");
  EXPECT_TRUE(KilledWithin1s(agent));
  // Not this job's agent: left alone, and no agent of the job is that pid.
  EXPECT_EQ(Output(KillAgentCommand({other, 0}, "0123abcd")),
            std::string(kAgentGone) + " " + std::to_string(other) + "\n");
  EXPECT_FALSE(KilledWithin1s(other)) << "another job's process lives";
}

// The pid names the job's agent but not the process the Hello came from (it
// started at another time: the pid was reused): left alone.
TEST(KillAgentCommand, LeavesAPidThatStartedAtAnotherTime) {
  const pid_t agent = ChildWithWord("0123abcd");
  ASSERT_GT(agent, 0);
  const uint64_t started = base::ProcessStartTicks(agent);
  ASSERT_GT(started, 0u);
  EXPECT_EQ(Output(KillAgentCommand({agent, started + 1}, "0123abcd")),
            std::string(kAgentGone) + " " + std::to_string(agent) + "\n");
  EXPECT_FALSE(KilledWithin1s(agent)) << "a process that started later lives";
}

TEST(KillAgentCommand, QuotesTheJobId) {
  const std::string c = KillAgentCommand({42, 7}, "a b");
  EXPECT_NE(c.find("grep -qzxF -- 'a b' /proc/42/cmdline"), std::string::npos)
      << c;
  EXPECT_NE(c.find("/proc/42/stat | cut -d' ' -f20)\" = 7 ]"),
            std::string::npos)
      << c;
  EXPECT_NE(c.find("kill -KILL 42"), std::string::npos) << c;
}

}  // namespace
}  // namespace dslaunch::launcher
