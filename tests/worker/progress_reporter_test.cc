#include "worker/progress_reporter.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <nlohmann/json.hpp>

#include "proto/progress.h"

namespace dslaunch::worker {
namespace {

TEST(ProgressReporter, RecordIsValidJsonAndTheLossRoundTrips) {
  StepReport r;
  r.step = 42;
  r.loss = 2.3456789f;
  r.lr = 6e-4;
  r.grad_norm = 1.25f;
  r.tokens_per_s = 51200.5;
  r.samples_per_s = 50;
  r.model_state_bytes = 16 * 124439808LL;
  const std::string json = FormatStepReport(r, 123456789);
  ASSERT_TRUE(proto::ValidateProgressRecord(json).ok()) << json;
  auto parsed = nlohmann::json::parse(json);
  EXPECT_EQ(parsed["step"], 42);
  EXPECT_EQ(static_cast<float>(parsed["loss"].get<double>()),
            r.loss);  // bit-exact
  EXPECT_EQ(parsed["model_state_bytes"], 16 * 124439808LL);
  EXPECT_EQ(parsed["rss_bytes"], 123456789);
}

TEST(ProgressReporter, GpuMemoryOnlyFromAGpuRank) {
  StepReport r;
  r.step = 3;
  auto parsed = nlohmann::json::parse(FormatStepReport(r, 1));
  EXPECT_FALSE(parsed.contains("gpu_mem_bytes"));
  r.gpu_mem_bytes = int64_t{15} << 30;
  const std::string json = FormatStepReport(r, 1);
  ASSERT_TRUE(proto::ValidateProgressRecord(json).ok()) << json;
  parsed = nlohmann::json::parse(json);
  EXPECT_EQ(parsed["gpu_mem_bytes"], int64_t{15} << 30);
  EXPECT_EQ(parsed["step"], 3);
}

TEST(ProgressReporter, Fp16sScaleAndSkippedStepsOnlyUnderFp16) {
  StepReport r;
  EXPECT_FALSE(
      nlohmann::json::parse(FormatStepReport(r, 1)).contains("skipped_steps"));
  r.loss_scale = 32768;
  r.skipped_steps = 3;
  r.gpu_mem_bytes = 1024;
  const std::string json = FormatStepReport(r, 1);
  ASSERT_TRUE(proto::ValidateProgressRecord(json).ok()) << json;
  auto parsed = nlohmann::json::parse(json);
  EXPECT_EQ(parsed["loss_scale"], 32768);
  EXPECT_EQ(parsed["skipped_steps"], 3);
  EXPECT_EQ(parsed["gpu_mem_bytes"], 1024);
}

TEST(ProgressReporter, WithoutALauncherReportingIsANoOp) {
  ::unsetenv("DSLAUNCH_PROGRESS");
  ProgressReporter reporter;
  EXPECT_FALSE(reporter.connected());
  reporter.Report(StepReport{});
  EXPECT_GT(ResidentBytes(), 0);
}

}  // namespace
}  // namespace dslaunch::worker
