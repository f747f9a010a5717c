// The `tensorboard` section of a DeepSpeed config and rank 0's event file.
#include "worker/tensorboard_monitor.h"

#include <gtest/gtest.h>

#include <cstdlib>  // mkdtemp
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "base/tensorboard_event.pb.h"
#include "worker/train_config.h"

namespace dslaunch::worker {
namespace {

namespace fs = std::filesystem;

constexpr char kBatch[] = R"("train_batch_size": 8, )";

StatusOr<TrainConfig> Parse(const std::string& tensorboard) {
  return ParseTrainConfig(
      std::string("{") + kBatch + R"("tensorboard": )" + tensorboard + "}",
      "ds.json", 1);
}

std::string ErrorOf(const std::string& tensorboard) {
  auto c = Parse(tensorboard);
  EXPECT_FALSE(c.ok());
  return c.ok() ? "" : c.status().message();
}

TEST(TensorBoardConfig, DefaultsAreDeepSpeeds) {
  auto c = ParseTrainConfig(
      std::string("{") + kBatch + "\"steps_per_print\": 1}", "ds.json", 1);
  ASSERT_TRUE(c.ok()) << c.status().message();
  EXPECT_FALSE(c->tensorboard.enabled);
  EXPECT_EQ(c->tensorboard.output_path, "");
  EXPECT_EQ(c->tensorboard.job_name, "DeepSpeedJobName");
}

TEST(TensorBoardConfig, ReadsTheSection) {
  auto c = Parse(
      R"({"enabled": true, "output_path": "/tmp/tb", "job_name": "gpt"})");
  ASSERT_TRUE(c.ok()) << c.status().message();
  EXPECT_TRUE(c->tensorboard.enabled);
  EXPECT_EQ(c->tensorboard.output_path, "/tmp/tb");
  EXPECT_EQ(c->tensorboard.job_name, "gpt");
  EXPECT_TRUE(c->warnings.empty());
}

TEST(TensorBoardConfig, WrongTypesNameTheKeyAndLine) {
  EXPECT_NE(ErrorOf(R"({"enabled": "sometimes"})")
                .find("ds.json:1: tensorboard.enabled: expected"),
            std::string::npos)
      << ErrorOf(R"({"enabled": "sometimes"})");
  EXPECT_NE(
      ErrorOf(R"({"output_path": [1, 2]})").find("tensorboard.output_path"),
      std::string::npos);
  EXPECT_NE(ErrorOf(R"(["enabled"])").find("tensorboard: expected a mapping"),
            std::string::npos)
      << ErrorOf(R"(["enabled"])");
}

TEST(TensorBoardConfig, UnknownKeysWarn) {
  auto c = Parse(R"({"enabled": true, "flush_secs": 5})");
  ASSERT_TRUE(c.ok());
  ASSERT_EQ(c->warnings.size(), 1u);
  EXPECT_NE(c->warnings[0].find("unknown key 'tensorboard.flush_secs'"),
            std::string::npos);
}

TEST(TensorBoardConfig, OverridesWork) {
  auto c = Parse(R"({"enabled": false})");
  ASSERT_TRUE(c.ok());
  ASSERT_TRUE(ApplyOverride(&*c, "tensorboard.enabled=true").ok());
  ASSERT_TRUE(ApplyOverride(&*c, "tensorboard.job_name=run2").ok());
  EXPECT_TRUE(c->tensorboard.enabled);
  EXPECT_EQ(c->tensorboard.job_name, "run2");
}

TEST(TensorBoardConfig, DirectoryJoinsAsPythonDoes) {
  TensorBoardConfig tb;
  EXPECT_EQ(TensorBoardDir(tb), "DeepSpeedJobName");
  tb.output_path = "out";
  tb.job_name = "j";
  EXPECT_EQ(TensorBoardDir(tb), "out/j");
  tb.output_path = "out/";
  EXPECT_EQ(TensorBoardDir(tb), "out/j");
  tb.job_name = "/abs";
  EXPECT_EQ(TensorBoardDir(tb), "/abs");
}

class TempDir {
 public:
  TempDir() {
    char tmpl[] = "/tmp/dsl-tbmon-XXXXXX";
    path_ = ::mkdtemp(tmpl);
  }
  ~TempDir() { fs::remove_all(path_); }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

std::vector<::dslaunch::tensorboard::Event> ReadEvents(const fs::path& dir) {
  std::vector<::dslaunch::tensorboard::Event> events;
  std::vector<fs::path> files;
  for (const auto& e : fs::directory_iterator(dir)) files.push_back(e.path());
  EXPECT_EQ(files.size(), 1u);
  if (files.size() != 1) return events;
  std::ifstream in(files[0], std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  const std::string data = ss.str();
  for (size_t at = 0; at + 12 <= data.size();) {
    uint64_t n = 0;
    for (int i = 7; i >= 0; --i) n = (n << 8) | uint8_t(data[at + i]);
    events.emplace_back();
    EXPECT_TRUE(events.back().ParseFromArray(data.data() + at + 12, int(n)));
    at += 12 + n + 4;
  }
  return events;
}

TEST(TensorBoardMonitor, RankZeroWritesDeepSpeedsTagsAtSampleCounts) {
  TempDir tmp;
  TrainConfig c;
  c.tensorboard = {true, tmp.path(), "job"};
  auto m = TensorBoardMonitor::Open(c, 0);
  ASSERT_TRUE(m.ok()) << m.status().message();
  (*m)->StepDone(1, 8, 2.5f, 1e-3);
  (*m)->StepDone(2, 8, 2.25f, 2e-3);
  m->reset();
  const auto events = ReadEvents(fs::path(tmp.path()) / "job");
  ASSERT_EQ(events.size(), 5u);
  EXPECT_EQ(events[0].file_version(), "brain.Event:2");
  EXPECT_EQ(events[1].summary().value(0).tag(), "Train/Samples/train_loss");
  EXPECT_EQ(events[1].step(), 0);
  EXPECT_EQ(events[1].summary().value(0).simple_value(), 2.5f);
  EXPECT_EQ(events[2].summary().value(0).tag(), "Train/Samples/lr");
  EXPECT_EQ(events[2].step(), 8);
  EXPECT_EQ(events[2].summary().value(0).simple_value(), 1e-3f);
  EXPECT_EQ(events[3].step(), 8);
  EXPECT_EQ(events[4].step(), 16);
}

TEST(TensorBoardMonitor, OtherRanksAndDisabledWriteNothing) {
  TempDir tmp;
  TrainConfig c;
  c.tensorboard = {true, tmp.path(), "job"};
  auto other = TensorBoardMonitor::Open(c, 1);
  ASSERT_TRUE(other.ok());
  EXPECT_FALSE((*other)->enabled());
  (*other)->StepDone(1, 8, 1, 1);
  c.tensorboard.enabled = false;
  auto off = TensorBoardMonitor::Open(c, 0);
  ASSERT_TRUE(off.ok());
  EXPECT_FALSE((*off)->enabled());
  EXPECT_TRUE(fs::is_empty(tmp.path()));
}

TEST(TensorBoardMonitor, ADirectoryThatCannotBeMadeNamesTheKey) {
  TrainConfig c;
  c.path = "ds.json";
  c.tensorboard = {true, "/dev/null/tb", "job"};
  auto m = TensorBoardMonitor::Open(c, 0);
  ASSERT_FALSE(m.ok());
  EXPECT_NE(m.status().message().find(
                "ds.json: tensorboard.output_path /dev/null/tb/job"),
            std::string::npos)
      << m.status().message();
}

}  // namespace
}  // namespace dslaunch::worker
