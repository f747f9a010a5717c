#include "launcher/terminal_writer.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <string>

namespace dslaunch::launcher {
namespace {

std::string ReadAll(FILE* f) {
  std::fflush(f);
  std::rewind(f);
  std::string out;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof(buf), f)) > 0) out.append(buf, n);
  return out;
}

TEST(TerminalWriter, KeepsOrderAndDrainsEverything) {
  FILE* f = std::tmpfile();
  ASSERT_NE(f, nullptr);
  std::string want;
  {
    TerminalWriter writer(
        /*limit=*/1024);  // small: Write must block and resume
    for (int i = 0; i < 2000; ++i) {
      std::string line = "line " + std::to_string(i) + "\n";
      want += line;
      writer.Write(f, line);
    }
    writer.Drain();
    EXPECT_EQ(ReadAll(f), want);
    writer.Write(f, "tail\n");
  }  // the destructor writes what is still queued
  EXPECT_EQ(ReadAll(f), want + "tail\n");
  std::fclose(f);
}

}  // namespace
}  // namespace dslaunch::launcher
