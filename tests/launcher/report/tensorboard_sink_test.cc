#include "launcher/report/tensorboard_sink.h"

#include <gtest/gtest.h>
#include <unistd.h>  // chown, geteuid

#include <algorithm>  // sort
#include <cstdlib>    // mkdtemp
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "base/tb_events.h"
#include "base/tensorboard_event.pb.h"

namespace dslaunch::launcher {
namespace {

namespace fs = std::filesystem;
using Scalars = std::vector<std::pair<std::string, double>>;

class TempDir {
 public:
  TempDir() {
    char tmpl[] = "/tmp/dsl-tbsink-XXXXXX";
    path_ = ::mkdtemp(tmpl);
  }
  ~TempDir() { fs::remove_all(path_); }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// step -> tag -> value of the one event file in `run`, read as TFRecord
// with both CRCs checked; the file_version event is left out.
std::map<int64_t, std::map<std::string, float>> ReadRun(const fs::path& run) {
  std::vector<fs::path> files;
  for (const auto& e : fs::directory_iterator(run)) files.push_back(e.path());
  EXPECT_EQ(files.size(), 1u) << run;
  std::map<int64_t, std::map<std::string, float>> steps;
  if (files.size() != 1) return steps;
  std::ifstream in(files[0], std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  const std::string data = ss.str();
  size_t at = 0;
  while (at + 12 <= data.size()) {
    uint64_t length = 0;
    for (int i = 7; i >= 0; --i) length = (length << 8) | uint8_t(data[at + i]);
    const std::string_view body =
        std::string_view(data).substr(at + 12, length);
    EXPECT_EQ(body.size(), length);
    uint32_t crc = 0;
    for (int i = 3; i >= 0; --i)
      crc = (crc << 8) | uint8_t(data[at + 12 + length + i]);
    EXPECT_EQ(crc, base::MaskedCrc32c(body));
    ::dslaunch::tensorboard::Event event;
    EXPECT_TRUE(event.ParseFromArray(body.data(), int(body.size())));
    for (const auto& v : event.summary().value()) {
      EXPECT_EQ(steps[event.step()].count(v.tag()), 0u) << "tag written twice";
      steps[event.step()][v.tag()] = v.simple_value();
    }
    at += 12 + length + 4;
  }
  EXPECT_EQ(at, data.size()) << "a truncated record";
  return steps;
}

Plan PlanOf(int world) {
  Plan plan;
  NodePlan node;
  node.host = "h0";
  for (int r = 0; r < world; ++r) node.slots.push_back(r);
  plan.nodes.push_back(node);
  plan.world_size = world;
  return plan;
}

class TensorBoardSinkTest : public ::testing::Test {
 protected:
  void Start(int world) {
    board_.Reset(PlanOf(world));
    for (int r = 0; r < world; ++r) board_.Started(r, 100 + r, 1.0);
    auto sink = TensorBoardSink::Create(tmp_.path() + "/tb", board_);
    ASSERT_TRUE(sink.ok()) << sink.status().ToString();
    sink_ = std::move(sink).value();
  }
  fs::path Run(const std::string& name) const {
    return fs::path(tmp_.path()) / "tb" / name;
  }

  TempDir tmp_;
  RankBoard board_;
  std::unique_ptr<TensorBoardSink> sink_;
};

TEST_F(TensorBoardSinkTest, OpensTheJobRunAtOnceAndRankRunsOnlyWhenTheyReport) {
  Start(1024);
  EXPECT_TRUE(fs::is_directory(Run("job")));
  sink_->Record(5, 1, {{"loss", 2.0}}, 10.0);
  std::vector<std::string> runs;
  for (const auto& e : fs::directory_iterator(Run(""))) {
    runs.push_back(e.path().filename().string());
  }
  std::sort(runs.begin(), runs.end());
  EXPECT_EQ(runs, (std::vector<std::string>{"job", "rank-5"}));
}

TEST_F(TensorBoardSinkTest, RankRunsHoldEveryScalarAsSent) {
  Start(2);
  sink_->Record(0, 3, {{"loss", 2.5}, {"tokens_per_s", 1000}, {"lr", 3e-4}},
                10);
  sink_->Record(1, 3, {{"loss", 1.5}}, 10);
  sink_->Record(0, 4, {{"loss", 2.25}}, 11);
  sink_->Close();
  ASSERT_TRUE(sink_->status().ok()) << sink_->status().ToString();
  const auto rank0 = ReadRun(Run("rank-0"));
  ASSERT_EQ(rank0.size(), 2u);
  EXPECT_EQ(rank0.at(3).at("loss"), 2.5f);
  EXPECT_EQ(rank0.at(3).at("tokens_per_s"), 1000.0f);
  EXPECT_EQ(rank0.at(3).at("lr"), 3e-4f);
  EXPECT_EQ(rank0.at(4).at("loss"), 2.25f);
  EXPECT_EQ(ReadRun(Run("rank-1")).at(3).at("loss"), 1.5f);
}

TEST_F(TensorBoardSinkTest, JobStepIsMeanLossAndSummedTokensOnceAllReported) {
  Start(3);
  sink_->Record(0, 7, {{"loss", 1.0}, {"tokens_per_s", 100}, {"lr", 0.1}}, 1);
  sink_->Record(1, 7, {{"loss", 2.0}, {"tokens_per_s", 200}, {"lr", 0.1}}, 2);
  sink_->Flush();
  EXPECT_TRUE(ReadRun(Run("job")).empty());  // rank 2 has not reported
  sink_->Record(2, 7, {{"loss", 4.5}, {"tokens_per_s", 300}, {"lr", 0.1}}, 3);
  sink_->Flush();
  const auto job = ReadRun(Run("job"));
  ASSERT_EQ(job.size(), 1u);
  EXPECT_EQ(job.at(7).at("loss"), 2.5f);
  EXPECT_EQ(job.at(7).at("tokens_per_s"), 600.0f);
  EXPECT_EQ(job.at(7).at("lr"), 0.1f);
}

TEST_F(TensorBoardSinkTest, ExitedRanksAreNotWaitedFor) {
  Start(3);
  board_.Exited(2, 0, 0, false);
  sink_->Record(0, 1, {{"loss", 1.0}}, 1);
  sink_->Record(1, 1, {{"loss", 3.0}}, 1);
  sink_->Record(0, 2, {{"loss", 5.0}}, 2);
  sink_->Flush();
  auto job = ReadRun(Run("job"));
  EXPECT_EQ(job.size(), 1u);
  EXPECT_EQ(job.at(1).at("loss"), 2.0f);
  board_.Exited(1, 1, 0, false);  // step 2 is complete now: Flush writes it
  sink_->Flush();
  job = ReadRun(Run("job"));
  EXPECT_EQ(job.at(2).at("loss"), 5.0f);
}

// A restart: the failed generation's incomplete step is written with the
// ranks that reported it, the job run gets dslaunch/restarts at the last
// step written, and the resumed ranks' repeated steps are not written twice.
TEST_F(TensorBoardSinkTest,
       ARestartIsMarkedAndRepeatedStepsAreNotWrittenTwice) {
  Start(2);
  sink_->Record(0, 1, {{"loss", 1.0}}, 1);
  sink_->Record(1, 1, {{"loss", 3.0}}, 1);
  sink_->Record(0, 2, {{"loss", 5.0}}, 2);  // rank 1 died before step 2
  sink_->Restart(1, 3);
  board_.Reset(PlanOf(2));  // the next generation, resumed from step 0
  sink_->Record(0, 1, {{"loss", 1.0}}, 4);
  sink_->Record(1, 1, {{"loss", 3.0}}, 4);
  sink_->Record(0, 2, {{"loss", 5.0}}, 5);
  sink_->Record(1, 2, {{"loss", 7.0}}, 5);
  sink_->Flush();
  const auto job = ReadRun(Run("job"));  // ReadRun fails on a tag twice
  ASSERT_EQ(job.size(), 2u);
  EXPECT_EQ(job.at(1).at("loss"), 2.0f);
  EXPECT_EQ(job.at(2).at("loss"), 5.0f);  // as rank 0 alone had it
  EXPECT_EQ(job.at(2).at("dslaunch/restarts"), 1.0f);
}

// A script reporting from rank 0 only: the ranks that never reported a step
// stop holding the job run back once kReporterLag newer steps came.
TEST_F(TensorBoardSinkTest, RanksThatNeverReportHoldStepsOnlyBriefly) {
  Start(2);
  for (int step = 1; step <= 20; ++step) {
    board_.Record(0, nlohmann::ordered_json{{"step", step}}, step);
    sink_->Record(0, step, {{"loss", double(step)}}, step);
  }
  sink_->Flush();
  auto job = ReadRun(Run("job"));
  ASSERT_EQ(job.size(), 20u - TensorBoardSink::kReporterLag);
  EXPECT_EQ(job.begin()->first, 1);
  EXPECT_EQ(job.at(12).at("loss"), 12.0f);
}

TEST_F(TensorBoardSinkTest, AtMost64StepsWaitThenTheOldestIsWrittenAsItIs) {
  Start(2);
  // Rank 1 reported once (it is a reporter, only late): it holds steps back.
  board_.Record(1, nlohmann::ordered_json{{"step", 0}}, 1.0);
  for (int step = 0; step < 100; ++step) {
    sink_->Record(0, step, {{"loss", double(step)}}, step);
  }
  sink_->Flush();
  auto job = ReadRun(Run("job"));
  ASSERT_EQ(job.size(), 100u - TensorBoardSink::kMaxPendingSteps);
  EXPECT_EQ(job.begin()->first, 0);
  EXPECT_EQ(job.rbegin()->first, 35);
  EXPECT_EQ(job.at(35).at("loss"), 35.0f);
  sink_->Record(1, 10, {{"loss", 1000.0}}, 200);  // late: not written again
  sink_->Close();
  job = ReadRun(Run("job"));
  EXPECT_EQ(job.size(), 100u);  // Close writes what waits
  EXPECT_EQ(job.at(10).at("loss"), 10.0f);
  EXPECT_EQ(job.at(99).at("loss"), 99.0f);
}

TEST_F(TensorBoardSinkTest, ARanksFirstValueOfATagAtAStepCounts) {
  Start(2);
  sink_->Record(0, 1, {{"loss", 1.0}}, 1);
  sink_->Record(0, 1, {{"loss", 9.0}, {"val_loss", 4.0}}, 1);
  sink_->Record(1, 1, {{"loss", 3.0}}, 1);
  sink_->Close();
  const auto job = ReadRun(Run("job"));
  EXPECT_EQ(job.at(1).at("loss"), 2.0f);
  EXPECT_EQ(job.at(1).at("val_loss"), 4.0f);  // mean of the ranks that sent it
}

TEST_F(TensorBoardSinkTest, UnknownRanksAreIgnored) {
  Start(1);
  sink_->Record(7, 1, {{"loss", 1.0}}, 1);
  sink_->Close();
  EXPECT_FALSE(fs::exists(Run("rank-7")));
  EXPECT_TRUE(ReadRun(Run("job")).empty());
}

TEST_F(TensorBoardSinkTest, ARankRunThatCannotBeMadeIsKeptAsTheError) {
  Start(2);
  std::ofstream(Run("rank-1")) << "in the way";
  sink_->Record(1, 1, {{"loss", 3.0}}, 1);
  sink_->Record(1, 2, {{"loss", 3.0}}, 1);  // not tried again, no crash
  sink_->Record(0, 1, {{"loss", 1.0}}, 1);
  sink_->Close();
  ASSERT_FALSE(sink_->status().ok());
  EXPECT_NE(sink_->status().message().find("rank-1"), std::string::npos)
      << sink_->status().message();
  EXPECT_EQ(ReadRun(Run("job")).at(1).at("loss"), 2.0f);
  EXPECT_EQ(ReadRun(Run("rank-0")).at(1).at("loss"), 1.0f);
}

TEST_F(TensorBoardSinkTest, ARankRunPlantedAsALinkIsNotFollowed) {
  Start(2);
  const fs::path elsewhere = fs::path(tmp_.path()) / "elsewhere";
  fs::create_directories(elsewhere);
  fs::create_directory_symlink(elsewhere, Run("rank-1"));
  sink_->Record(1, 1, {{"loss", 3.0}}, 1);
  sink_->Record(0, 1, {{"loss", 1.0}}, 1);
  sink_->Close();
  ASSERT_FALSE(sink_->status().ok());
  EXPECT_NE(sink_->status().message().find("symbolic link"), std::string::npos)
      << sink_->status().message();
  EXPECT_TRUE(fs::is_empty(elsewhere));
  EXPECT_EQ(ReadRun(Run("rank-0")).at(1).at("loss"), 1.0f);
}

// The runs are made relative to the directory opened at the start: the
// --tensorboard path swapped for a link afterwards is never written through.
TEST_F(TensorBoardSinkTest, ARankRunIsMadeInTheDirectoryOpenedAtTheStart) {
  Start(2);
  const fs::path elsewhere = fs::path(tmp_.path()) / "elsewhere";
  fs::create_directories(elsewhere);
  fs::rename(Run(""), fs::path(tmp_.path()) / "moved");
  fs::create_directory_symlink(elsewhere, fs::path(tmp_.path()) / "tb");
  sink_->Record(1, 1, {{"loss", 3.0}}, 1);
  sink_->Close();
  EXPECT_TRUE(sink_->status().ok()) << sink_->status().message();
  EXPECT_TRUE(fs::is_empty(elsewhere));
  const fs::path moved = fs::path(tmp_.path()) / "moved";
  EXPECT_EQ(ReadRun(moved / "rank-1").at(1).at("loss"), 3.0f);
}

TEST_F(TensorBoardSinkTest, ARankRunOfAnotherUserIsNotWrittenInto) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root to give a directory away";
  Start(2);
  fs::create_directories(Run("rank-1"));
  ASSERT_EQ(::chown(Run("rank-1").c_str(), 65534, 65534), 0);
  sink_->Record(1, 1, {{"loss", 3.0}}, 1);
  sink_->Record(0, 1, {{"loss", 1.0}}, 1);
  sink_->Close();
  ASSERT_FALSE(sink_->status().ok());
  EXPECT_NE(sink_->status().message().find(Run("rank-1").string() +
                                           " belongs to another user"),
            std::string::npos)
      << sink_->status().message();
  EXPECT_TRUE(fs::is_empty(Run("rank-1")));
  EXPECT_EQ(ReadRun(Run("rank-0")).at(1).at("loss"), 1.0f);
}

TEST(TensorBoardSink, ADirectoryOfAnotherUserIsRefusedNamingIt) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root to give a directory away";
  TempDir tmp;
  const fs::path theirs = fs::path(tmp.path()) / "tb";
  fs::create_directories(theirs);
  ASSERT_EQ(::chown(theirs.c_str(), 65534, 65534), 0);
  RankBoard board;
  auto sink = TensorBoardSink::Create(theirs.string(), board);
  ASSERT_FALSE(sink.ok());
  EXPECT_EQ(sink.status().code(), StatusCode::kIoError);
  EXPECT_EQ(sink.status().message().find("--tensorboard " + theirs.string()),
            0u)
      << sink.status().message();
  EXPECT_NE(sink.status().message().find("belongs to another user"),
            std::string::npos)
      << sink.status().message();
  EXPECT_TRUE(fs::is_empty(theirs));
}

TEST(TensorBoardSink, ADirectoryThatCannotBeMadeNamesTheFlag) {
  RankBoard board;
  auto sink = TensorBoardSink::Create("/dev/null/tb", board);
  ASSERT_FALSE(sink.ok());
  EXPECT_NE(sink.status().message().find("--tensorboard /dev/null/tb"),
            std::string::npos)
      << sink.status().message();
}

}  // namespace
}  // namespace dslaunch::launcher
