#include "agent/probe_files.h"

#include <fcntl.h>  // AT_FDCWD
#include <gtest/gtest.h>
#include <stdlib.h>  // mkdtemp
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

namespace dslaunch::agent {
namespace {

class ProbeFiles : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/dsl-probe-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  std::string File(const std::string& name, const std::string& text) {
    const std::string path = dir_ + "/" + name;
    std::ofstream(path) << text;
    return path;
  }

  // Sets the file's modification time `seconds` into the past.
  static void Age(const std::string& path, int seconds) {
    struct timespec times[2];
    ::clock_gettime(CLOCK_REALTIME, &times[1]);
    times[1].tv_sec -= seconds;
    times[0] = times[1];
    ASSERT_EQ(::utimensat(AT_FDCWD, path.c_str(), times, 0), 0);
  }

  std::string dir_;
};

TEST_F(ProbeFiles, KnowsTheFilesAnAgentWritesAndNothingElse) {
  EXPECT_TRUE(LeftByAnAgent(File("a", "joined\n")));
  EXPECT_TRUE(LeftByAnAgent(File("b", "node 17\n")));
  EXPECT_TRUE(LeftByAnAgent(File("c", kAliveText)));
  // What the agent writes is what is known: one spelling for both.
  EXPECT_TRUE(LeftByAnAgent(File("r0", ReadyFileText(-1))));
  EXPECT_TRUE(LeftByAnAgent(File("r1", ReadyFileText(0))));
  EXPECT_TRUE(LeftByAnAgent(File("r2", ReadyFileText(123456))));
  EXPECT_FALSE(LeftByAnAgent(File("d", "node \n")));
  EXPECT_FALSE(LeftByAnAgent(File("e", "node 1x\n")));
  EXPECT_FALSE(LeftByAnAgent(File("f", "joined")));
  EXPECT_FALSE(LeftByAnAgent(File("g", "")));
  EXPECT_FALSE(LeftByAnAgent(File("h", std::string(100, 'x'))));
  EXPECT_FALSE(LeftByAnAgent(dir_)) << "a directory";
  EXPECT_FALSE(LeftByAnAgent(dir_ + "/missing"));
  const std::string link = dir_ + "/link";
  ASSERT_EQ(::symlink((dir_ + "/a").c_str(), link.c_str()), 0);
  EXPECT_FALSE(LeftByAnAgent(link)) << "a link is never followed";
}

TEST_F(ProbeFiles, ClaimingRemovesOnlyWhatAnAgentLeft) {
  bool removed = true;
  EXPECT_TRUE(ClaimProbeFile("--ready_file", dir_ + "/new", &removed).ok());
  EXPECT_FALSE(removed);
  const std::string left = File("left", "node 3\n");
  EXPECT_TRUE(ClaimProbeFile("--ready_file", left, &removed).ok());
  EXPECT_TRUE(removed);
  EXPECT_FALSE(std::filesystem::exists(left));
  const std::string other = File("other", "#!/bin/sh\n");
  const Status st = ClaimProbeFile("--alive_file", other, &removed);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("--alive_file " + other), std::string::npos);
  EXPECT_TRUE(std::filesystem::exists(other));
}

TEST_F(ProbeFiles, AliveCheckPassesOnlyForAFreshFile) {
  const std::string alive = File("alive", kAliveText);
  EXPECT_EQ(CheckAlive(alive, 30), 0);
  Age(alive, 60);
  EXPECT_EQ(CheckAlive(alive, 30), 1);
  EXPECT_EQ(CheckAlive(alive, 90), 0);
  EXPECT_EQ(CheckAlive(dir_ + "/missing", 30), 1);
}

}  // namespace
}  // namespace dslaunch::agent
