#include "launcher/start/ssh_starter.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <string>
#include <thread>

namespace dslaunch::launcher {
namespace {

// A child whose command line holds `word` as one argument, as an agent's
// holds its job id: sh -c 'sleep 30' WORD.
pid_t ChildWithWord(const std::string& word) {
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::execl("/bin/sh", "sh", "-c", "sleep 30", word.c_str(),
            static_cast<char*>(nullptr));
    ::_exit(127);
  }
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

// The kill a frozen agent gets over a second SSH connection: by pid, and
// only where that pid still runs this job's agent.
TEST(KillAgentCommand, KillsThePidOnlyWhileItRunsTheJobsAgent) {
  const pid_t agent = ChildWithWord("0123abcd");
  const pid_t other = ChildWithWord("0123abcd-not");
  EXPECT_EQ(std::system(KillAgentCommand(other, "0123abcd").c_str()) == 0,
            false);
  EXPECT_EQ(std::system(KillAgentCommand(agent, "0123abcd").c_str()), 0);
  EXPECT_TRUE(KilledWithin1s(agent));
  EXPECT_FALSE(KilledWithin1s(other)) << "another job's process lives";
}

TEST(KillAgentCommand, QuotesTheJobId) {
  EXPECT_EQ(
      KillAgentCommand(42, "a b"),
      "grep -qzxF -- 'a b' /proc/42/cmdline 2>/dev/null && kill -KILL 42");
}

}  // namespace
}  // namespace dslaunch::launcher
