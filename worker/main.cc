// dsworker: the training engine (filled by later issues). For now it prints
// its version and usage.
#include <cstdio>   // printf
#include <cstring>  // strcmp

#include "proto/version.h"

static void PrintUsage() {
  std::printf(
      "usage: dsworker <command> [options]\n"
      "\n"
      "commands:\n"
      "  train --config FILE   train a GPT-style model (coming with the CPU "
      "engine)\n"
      "  --version             print the version and exit\n"
      "  --help                print this help and exit\n");
}

int main(int argc, char** argv) {
  if (argc >= 2 && (!std::strcmp(argv[1], "--version") ||
                    !std::strcmp(argv[1], "version"))) {
    std::printf("dsworker %s (protocol %u)\n", dslaunch::kVersion,
                dslaunch::kProtocolVersion);
    return 0;
  }
  if (argc >= 2 &&
      (!std::strcmp(argv[1], "--help") || !std::strcmp(argv[1], "-h") ||
       !std::strcmp(argv[1], "help"))) {
    PrintUsage();
    return 0;
  }
  PrintUsage();
  if (argc >= 2) {
    std::fprintf(stderr,
                 "dsworker: unknown command '%s' (the training engine "
                 "is not built yet)\n",
                 argv[1]);
  }
  return 64;
}
