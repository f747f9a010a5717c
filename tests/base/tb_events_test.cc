#include "base/tb_events.h"

#include <fcntl.h>         // AT_FDCWD
#include <linux/fs.h>      // RENAME_EXCHANGE
#include <sys/resource.h>  // setrlimit
#include <sys/stat.h>      // stat
#include <sys/syscall.h>   // SYS_renameat2
#include <unistd.h>        // getpid, syscall, chown

#include <atomic>
#include <chrono>
#include <csignal>  // signal, SIGXFSZ
#include <cstdlib>  // mkdtemp
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "base/tensorboard_event.pb.h"
#include "gtest/gtest.h"

namespace dslaunch::base {
namespace {

class TempDir {
 public:
  TempDir() {
    char tmpl[] = "/tmp/dsl-tb-XXXXXX";
    path_ = ::mkdtemp(tmpl);
  }
  ~TempDir() { std::filesystem::remove_all(path_); }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

std::vector<std::string> ListDir(const std::string& dir) {
  std::vector<std::string> names;
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    names.push_back(e.path().filename().string());
  }
  return names;
}

std::string ReadAll(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

uint64_t LittleEndian(const std::string& s, size_t at, int bytes) {
  uint64_t v = 0;
  for (int i = bytes - 1; i >= 0; --i) {
    v = (v << 8) | static_cast<uint8_t>(s[at + i]);
  }
  return v;
}

// Reads a file as TFRecord does, checking both CRCs of every record.
std::vector<tensorboard::Event> ReadEvents(const std::string& path) {
  const std::string data = ReadAll(path);
  std::vector<tensorboard::Event> events;
  size_t at = 0;
  while (at < data.size()) {
    EXPECT_LE(at + 12, data.size()) << "truncated header at " << at;
    if (at + 12 > data.size()) break;
    const uint64_t length = LittleEndian(data, at, 8);
    EXPECT_EQ(LittleEndian(data, at + 8, 4),
              MaskedCrc32c(std::string_view(data).substr(at, 8)));
    EXPECT_LE(at + 12 + length + 4, data.size()) << "truncated record";
    if (at + 12 + length + 4 > data.size()) break;
    const std::string_view body =
        std::string_view(data).substr(at + 12, length);
    EXPECT_EQ(LittleEndian(data, at + 12 + length, 4), MaskedCrc32c(body));
    tensorboard::Event event;
    EXPECT_TRUE(
        event.ParseFromArray(body.data(), static_cast<int>(body.size())));
    events.push_back(event);
    at += 12 + length + 4;
  }
  return events;
}

TEST(Crc32c, MatchesKnownVectors) {
  EXPECT_EQ(Crc32c("123456789"), 0xE3069283u);
  EXPECT_EQ(Crc32c(""), 0u);
  EXPECT_EQ(Crc32c(std::string(32, '\0')), 0x8A9136AAu);  // RFC 3720 B.4
  EXPECT_EQ(Crc32c(std::string(32, '\xff')), 0x62A8AB43u);
  std::string ascending;
  for (int i = 0; i < 32; ++i) ascending.push_back(static_cast<char>(i));
  EXPECT_EQ(Crc32c(ascending), 0x46DD794Eu);
}

TEST(Crc32c, ExtendEqualsOneCall) {
  EXPECT_EQ(Crc32cExtend(Crc32c("12345"), "6789"), Crc32c("123456789"));
}

TEST(Crc32c, MaskRotatesAndAddsTheConstant) {
  const uint32_t crc = Crc32c("123456789");
  EXPECT_EQ(MaskedCrc32c("123456789"),
            static_cast<uint32_t>(((crc >> 15) | (crc << 17)) + 0xa282ead8u));
}

TEST(TfRecord, FramesLengthDataAndBothCrcs) {
  const std::string r = TfRecord("abc");
  ASSERT_EQ(r.size(), 8u + 4 + 3 + 4);
  EXPECT_EQ(LittleEndian(r, 0, 8), 3u);
  EXPECT_EQ(LittleEndian(r, 8, 4), MaskedCrc32c(r.substr(0, 8)));
  EXPECT_EQ(r.substr(12, 3), "abc");
  EXPECT_EQ(LittleEndian(r, 15, 4), MaskedCrc32c("abc"));
}

TEST(EventFileWriter, NamesTheFileAsTensorBoardExpects) {
  TempDir tmp;
  auto w = EventFileWriter::Create(tmp.path() + "/a/b", 1700000000.75, "test");
  ASSERT_TRUE(w.ok()) << w.status().ToString();
  const auto names = ListDir(tmp.path() + "/a/b");
  ASSERT_EQ(names.size(), 1u);
  const std::string prefix = "events.out.tfevents.1700000000.";
  EXPECT_EQ(names[0].rfind(prefix, 0), 0u) << names[0];
  EXPECT_NE(names[0].find("." + std::to_string(::getpid()) + "."),
            std::string::npos);
  EXPECT_EQ((*w)->path(), tmp.path() + "/a/b/" + names[0]);
}

TEST(EventFileWriter, TwoWritersInOneSecondGetTwoFiles) {
  TempDir tmp;
  auto a = EventFileWriter::Create(tmp.path(), 1700000000, "test");
  auto b = EventFileWriter::Create(tmp.path(), 1700000000, "test");
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_NE((*a)->path(), (*b)->path());
  EXPECT_EQ(ListDir(tmp.path()).size(), 2u);
}

TEST(EventFileWriter, FirstEventIsTheFileVersion) {
  TempDir tmp;
  auto w = EventFileWriter::Create(tmp.path(), 1700000000.5, "test");
  ASSERT_TRUE(w.ok());
  // Written at once: a reader sees a valid file before any scalar.
  const auto events = ReadEvents((*w)->path());
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].file_version(), "brain.Event:2");
  EXPECT_DOUBLE_EQ(events[0].wall_time(), 1700000000.5);
}

TEST(EventFileWriter, WritesScalarsThatReadBack) {
  TempDir tmp;
  auto w = EventFileWriter::Create(tmp.path(), 1.0, "test");
  ASSERT_TRUE(w.ok());
  (*w)->AddScalar("loss", 7, 2.5, 10.25);
  (*w)->AddScalars(8, {{"loss", 2.25}, {"lr", 3e-4}}, 11.0);
  (*w)->AddScalars(9, {}, 12.0);  // nothing
  (*w)->Close();
  EXPECT_TRUE((*w)->status().ok());
  const auto events = ReadEvents((*w)->path());
  ASSERT_EQ(events.size(), 3u);
  EXPECT_EQ(events[1].step(), 7);
  EXPECT_DOUBLE_EQ(events[1].wall_time(), 10.25);
  ASSERT_EQ(events[1].summary().value_size(), 1);
  EXPECT_EQ(events[1].summary().value(0).tag(), "loss");
  EXPECT_EQ(events[1].summary().value(0).simple_value(), 2.5f);
  EXPECT_EQ(events[2].step(), 8);
  ASSERT_EQ(events[2].summary().value_size(), 2);
  EXPECT_EQ(events[2].summary().value(1).tag(), "lr");
  EXPECT_EQ(events[2].summary().value(1).simple_value(), 3e-4f);
}

TEST(EventFileWriter, BuffersUntilFlushOrTheBound) {
  TempDir tmp;
  auto w = EventFileWriter::Create(tmp.path(), 1.0, "test");
  ASSERT_TRUE(w.ok());
  const size_t header = ReadAll((*w)->path()).size();
  (*w)->AddScalar("loss", 1, 1.0, 2.0);
  EXPECT_EQ(ReadAll((*w)->path()).size(), header);
  (*w)->Flush();
  EXPECT_GT(ReadAll((*w)->path()).size(), header);
  // Far more than the bound: most of it is on disk before any Flush.
  for (int step = 0; step < 10000; ++step) {
    (*w)->AddScalar("a_rather_long_tag_name_for_the_test", step, step, 2.0);
  }
  const size_t on_disk = ReadAll((*w)->path()).size();
  EXPECT_GT(on_disk, 10000u * 40 - EventFileWriter::kFlushBytes);
  (*w)->Close();
  EXPECT_EQ(ReadEvents((*w)->path()).size(), 10002u);
}

TEST(EventFileWriter, KeepsTheFirstWriteErrorAndDropsLaterEvents) {
  TempDir tmp;
  auto w = EventFileWriter::Create(tmp.path(), 1.0, "test");
  ASSERT_TRUE(w.ok());
  // A file size limit makes the next write fail with EFBIG.
  struct rlimit old;
  ASSERT_EQ(::getrlimit(RLIMIT_FSIZE, &old), 0);
  auto* old_handler = std::signal(SIGXFSZ, SIG_IGN);
  struct rlimit small = old;
  small.rlim_cur = 4096;
  ASSERT_EQ(::setrlimit(RLIMIT_FSIZE, &small), 0);
  for (int step = 0; step < 1000; ++step) (*w)->AddScalar("loss", step, 1, 2);
  (*w)->Flush();
  ASSERT_EQ(::setrlimit(RLIMIT_FSIZE, &old), 0);
  std::signal(SIGXFSZ, old_handler);
  ASSERT_FALSE((*w)->status().ok());
  EXPECT_EQ((*w)->status().code(), StatusCode::kIoError);
  EXPECT_NE((*w)->status().message().find("cannot write " + (*w)->path()),
            std::string::npos)
      << (*w)->status().message();
  const std::string first = (*w)->status().message();
  const size_t size = ReadAll((*w)->path()).size();
  (*w)->AddScalar("loss", 1001, 1, 2);  // dropped, no crash
  (*w)->Flush();
  (*w)->Close();
  EXPECT_EQ(ReadAll((*w)->path()).size(), size);
  EXPECT_EQ((*w)->status().message(), first);
}

TEST(EventFileWriter, ADirectoryThatCannotBeMadeIsAnError) {
  auto bad = EventFileWriter::Create("/dev/null/x", 1.0, "--tensorboard");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("--tensorboard /dev/null/x"),
            std::string::npos)
      << bad.status().message();
}

// The race of the attacker's review: the run directory is swapped with a
// link to another place while writers are being made. The writer opens the
// run once (never following a link) and makes its file relative to that
// descriptor, so no file ever lands in the other place.
TEST(EventFileWriter, ARunSwappedForALinkMeanwhileIsNeverWrittenThrough) {
  TempDir tmp;
  const std::string run = tmp.path() + "/run";
  const std::string link = tmp.path() + "/swap";
  const std::string elsewhere = tmp.path() + "/elsewhere";
  std::filesystem::create_directories(run);
  std::filesystem::create_directories(elsewhere);
  std::filesystem::create_directory_symlink(elsewhere, link);
  std::atomic<bool> stop{false};
  std::atomic<int> swaps{0};
  std::thread swapper([&] {
    while (!stop) {
      swaps += ::syscall(SYS_renameat2, AT_FDCWD, run.c_str(), AT_FDCWD,
                         link.c_str(), RENAME_EXCHANGE) == 0;
    }
  });
  // For a while, not a count. The race is only run when both threads hold a
  // core at once: the old code (lstat, then open by path) wrote through the
  // link in 3 of 6 runs on a loaded 2-core machine, so a pass here proves
  // little alone; WritesIntoTheRunOpenedEvenIfItIsSwapped below and
  // ARankRunIsMadeInTheDirectoryOpenedAtTheStart (tensorboard_sink_test)
  // show the same deterministically.
  int made = 0;
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(3);
  while (std::chrono::steady_clock::now() < until) {
    auto w = EventFileWriter::Create(run, 1.0, "t");
    made += w.ok();
  }
  stop = true;
  swapper.join();
  EXPECT_GT(made, 0);
  EXPECT_GT(swaps.load(), 0);
  EXPECT_TRUE(std::filesystem::is_empty(elsewhere))
      << ListDir(elsewhere).size() << " files written through the link";
}

// By construction: the run is a descriptor; swapping its path for a link
// after it was opened changes nothing.
TEST(EventFileWriter, WritesIntoTheRunOpenedEvenIfItIsSwapped) {
  TempDir tmp;
  const std::string elsewhere = tmp.path() + "/elsewhere";
  std::filesystem::create_directories(elsewhere);
  auto top = SafeDir::Open(tmp.path(), "t");
  ASSERT_TRUE(top.ok());
  auto run = top->Child("run");
  ASSERT_TRUE(run.ok());
  std::filesystem::rename(tmp.path() + "/run", tmp.path() + "/moved");
  std::filesystem::create_directory_symlink(elsewhere, tmp.path() + "/run");
  auto w = EventFileWriter::Create(*run, 1.0, "t");
  ASSERT_TRUE(w.ok()) << w.status().message();
  EXPECT_TRUE(std::filesystem::is_empty(elsewhere));
  EXPECT_EQ(ListDir(tmp.path() + "/moved").size(), 1u);
}

TEST(EventFileWriter, ARunOfAnotherUserIsRefused) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root to give a directory away";
  TempDir tmp;
  const std::string run = tmp.path() + "/run";
  std::filesystem::create_directories(run);
  ASSERT_EQ(::chown(run.c_str(), 65534, 65534), 0);
  auto w = EventFileWriter::Create(run, 1.0, "tensorboard.output_path");
  ASSERT_FALSE(w.ok());
  EXPECT_NE(w.status().message().find(run + " belongs to another user"),
            std::string::npos)
      << w.status().message();
  EXPECT_TRUE(std::filesystem::is_empty(run));
}

TEST(CreateEventDir, NamesTheSettingAndThePath) {
  TempDir tmp;
  const std::string file = tmp.path() + "/file";
  std::ofstream(file) << "x";
  Status s = CreateEventDir(file + "/sub", "--tensorboard");
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.code(), StatusCode::kIoError);
  EXPECT_NE(s.message().find("--tensorboard " + file + "/sub"),
            std::string::npos)
      << s.message();
  s = CreateEventDir(file, "--tensorboard");
  EXPECT_NE(s.message().find("not a directory"), std::string::npos);
  EXPECT_TRUE(CreateEventDir(tmp.path() + "/x/y/z", "t").ok());
  struct stat st;
  ASSERT_EQ(::stat((tmp.path() + "/x/y/z").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0027, 0u);  // never group-writable nor for others
}

}  // namespace
}  // namespace dslaunch::base
