// The dsworker commands behind main.cc's flags. Each returns the process
// exit status (0, 64 bad usage, 65 bad config or data, 69 peers lost, 70
// internal) after printing what went wrong.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "worker/prepare.h"

namespace dslaunch::worker {

struct TrainArgs {
  std::string config;
  std::string init_model;
  std::vector<std::string> overrides;
  std::string save_model;
  int local_rank = -1;
  std::string device = "auto";  // --device auto|cpu|cuda
};
struct PrepareArgs {
  PrepareOptions options;
};
struct EvalArgs {
  std::string model, data;
  int batch = 0, seq = 0;
};
struct SampleArgs {
  std::string model, tokenizer, prompt;
  int tokens = 64;
  uint64_t seed = 1337;
};

int RunTrain(const TrainArgs& args);
int RunPrepare(const PrepareArgs& args);
int RunEval(const EvalArgs& args);
int RunSample(const SampleArgs& args);
// Writes the parameters of checkpoint `dir` as an llm.c model file.
int RunExport(const std::string& dir, const std::string& out);

}  // namespace dslaunch::worker
