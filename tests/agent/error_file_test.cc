#include "agent/error_file.h"

#include <gtest/gtest.h>
#include <stdlib.h>    // mkdtemp
#include <sys/stat.h>  // mkfifo
#include <unistd.h>    // symlink

#include <chrono>
#include <filesystem>
#include <fstream>
#include <string>

namespace dslaunch::agent {
namespace {

class ErrorFileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/dsl-error-file-test-XXXXXX";
    dir_ = ::mkdtemp(tmpl);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::string Write(const std::string& name, const std::string& text) {
    const std::string path = dir_ + "/" + name;
    std::ofstream(path, std::ios::binary) << text;
    return path;
  }
  std::string dir_;
};

TEST_F(ErrorFileTest, ReadsTheFileAsTheRankLeftIt) {
  const std::string json =
      "{\"message\": {\"message\": \"RuntimeError: boom\", \"extraInfo\": "
      "{\"py_callstack\": \"Traceback ...\", \"timestamp\": \"1\"}}}";
  auto text = ReadErrorFile(Write("error-3.json", json));
  ASSERT_TRUE(text.ok()) << text.status().message();
  EXPECT_EQ(*text, json);
}

TEST_F(ErrorFileTest, NoFileIsNoError) {
  auto text = ReadErrorFile(dir_ + "/error-0.json");
  ASSERT_TRUE(text.ok()) << text.status().message();
  EXPECT_EQ(*text, "");
}

TEST_F(ErrorFileTest, RefusesASymlink) {
  const std::string target = Write("secret", "not for the launcher");
  const std::string link = dir_ + "/error-1.json";
  ASSERT_EQ(::symlink(target.c_str(), link.c_str()), 0);
  auto text = ReadErrorFile(link);
  ASSERT_FALSE(text.ok());
  EXPECT_NE(text.status().message().find("symlink"), std::string::npos)
      << text.status().message();
}

TEST_F(ErrorFileTest, AFifoDoesNotBlockAndIsRefused) {
  const std::string fifo = dir_ + "/error-2.json";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  const auto t0 = std::chrono::steady_clock::now();
  auto text = ReadErrorFile(fifo);  // no writer: a blocking open would hang
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(1));
  ASSERT_FALSE(text.ok());
  EXPECT_NE(text.status().message().find("not a regular file"),
            std::string::npos);
}

TEST_F(ErrorFileTest, ADirectoryIsRefused) {
  EXPECT_FALSE(ReadErrorFile(dir_).ok());
}

TEST_F(ErrorFileTest, ReadsAtMost64KiBAndDropsTheRest) {
  const std::string big(200 * 1024, 'x');
  auto text = ReadErrorFile(Write("error-4.json", big));
  ASSERT_TRUE(text.ok());
  EXPECT_EQ(text->size(), kMaxErrorFileBytes);
  EXPECT_EQ(kMaxErrorFileBytes, 64u * 1024);
  auto small = ReadErrorFile(Write("error-5.json", big), 10);
  ASSERT_TRUE(small.ok());
  EXPECT_EQ(*small, std::string(10, 'x'));
}

}  // namespace
}  // namespace dslaunch::agent
