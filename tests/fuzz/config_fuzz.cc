// libFuzzer target: dsworker's config reader (DeepSpeed JSON or YAML). The
// input is config text, parsed in memory for a world size of 2, exactly as
// LoadTrainConfig does after reading the file; a line of the form
// `#override key=value` is then applied as a `--set` override. Accepted
// configs must satisfy DeepSpeed's batch rule and the ranges the trainer
// relies on; every error must name the file. Single-threaded.
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>

#include "worker/lr_schedule.h"
#include "worker/train_config.h"

namespace {

using dslaunch::worker::TrainConfig;

void Require(bool condition, const char* what) {
  if (!condition) {
    std::fprintf(stderr, "invariant broken: %s\n", what);
    std::abort();
  }
}

void CheckConfig(const TrainConfig& c) {
  const auto& b = c.batch;
  Require(b.train_batch_size > 0 && b.micro_batch_per_gpu > 0 &&
              b.gradient_accumulation_steps > 0,
          "batch sizes are positive");
  Require(int64_t{b.micro_batch_per_gpu} * b.gradient_accumulation_steps *
                  b.world_size ==
              b.train_batch_size,
          "train_batch_size = micro * accumulation * world_size");
  Require(c.zero.stage >= 0 && c.zero.stage <= 3, "zero stage in 0..3");
  Require(c.model.n_layer > 0 && c.model.n_head > 0 && c.model.n_embd > 0,
          "model shape is positive");
  for (int64_t step :
       {int64_t{0}, int64_t{1}, int64_t{1000}, int64_t{1} << 40}) {
    const double lr = dslaunch::worker::LearningRate(c, step);
    Require(!std::isnan(lr), "learning rate is a number");
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  auto config = dslaunch::worker::ParseTrainConfig(text, "ds.json", 2);
  if (!config.ok()) {
    Require(config.status().message().rfind("ds.json:", 0) == 0,
            "errors name the file");
    return 0;
  }
  CheckConfig(*config);
  const size_t at = text.find("#override ");
  if (at != std::string_view::npos) {
    std::string_view assignment = text.substr(at + 10);
    assignment = assignment.substr(0, assignment.find('\n'));
    if (dslaunch::worker::ApplyOverride(&*config, assignment).ok()) {
      CheckConfig(*config);
    }
  }
  return 0;
}
