#include "agent/progress_server.h"

#include <fcntl.h>  // fcntl, O_NONBLOCK
#include <gtest/gtest.h>
#include <stdlib.h>      // mkdtemp
#include <sys/socket.h>  // send
#include <sys/stat.h>    // stat
#include <unistd.h>      // close

#include <boost/asio/io_context.hpp>
#include <cerrno>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "base/unix_socket.h"
#include "proto/progress.h"
#include "tests/common/run_until.h"

namespace dslaunch::agent {
namespace {

namespace asio = boost::asio;

using dslaunch::testing::RunUntil;

class RecordingDelegate : public ProgressServer::Delegate {
 public:
  struct Record {
    int rank;
    std::string json;
    double time;
  };
  void OnProgressRecord(int rank, std::string json, double time) override {
    records.push_back({rank, std::move(json), time});
  }
  void OnMalformedProgress(int rank, const Status& why) override {
    ++malformed[rank];
    reasons.push_back(why);
  }
  int total_malformed() const {
    int n = 0;
    for (const auto& [rank, count] : malformed) n += count;
    return n;
  }
  std::vector<std::string> Jsons() const {
    std::vector<std::string> out;
    for (const Record& r : records) out.push_back(r.json);
    return out;
  }

  std::vector<Record> records;
  std::map<int, int> malformed;
  std::vector<Status> reasons;
};

double NowSeconds() {
  using namespace std::chrono;
  return duration<double>(system_clock::now().time_since_epoch()).count();
}

class ProgressServerTest : public ::testing::Test {
 protected:
  ProgressServerTest() {
    char tmpl[] = "/tmp/dsl-progress-test-XXXXXX";
    dir_ = ::mkdtemp(tmpl);
  }
  ~ProgressServerTest() override {
    server_.Close();
    std::filesystem::remove_all(dir_);
  }
  std::string SocketPath(int rank) {
    return dir_ + "/progress-" + std::to_string(rank) + ".sock";
  }
  std::string ListenOk(int rank) {
    const std::string path = SocketPath(rank);
    Status st = server_.Listen(rank, path);
    EXPECT_TRUE(st.ok()) << st.message();
    return path;
  }
  // A raw client connection, as a rank in another language would open.
  int ConnectRaw(const std::string& path) {
    StatusOr<int> fd = base::ConnectUnixSocket(path);
    EXPECT_TRUE(fd.ok()) << fd.status().message();
    return fd.ok() ? *fd : -1;
  }
  // Writes all of `data` to `fd` while the server keeps reading, so large
  // writes cannot fill the socket buffer and block the test.
  void WriteRunning(int fd, std::string_view data) {
    ASSERT_EQ(::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | O_NONBLOCK), 0);
    const auto deadline =
        std::chrono::steady_clock::now() + std::chrono::seconds(5);
    while (!data.empty()) {
      ASSERT_LT(std::chrono::steady_clock::now(), deadline);
      const ssize_t n = ::send(fd, data.data(), data.size(), MSG_NOSIGNAL);
      if (n > 0) {
        data.remove_prefix(static_cast<size_t>(n));
      } else {
        ASSERT_TRUE(errno == EAGAIN || errno == EINTR) << errno;
        io_.restart();
        io_.run_for(std::chrono::milliseconds(5));
      }
    }
  }

  asio::io_context io_;
  RecordingDelegate delegate_;
  ProgressServer server_{io_, &delegate_};
  std::string dir_;
};

TEST_F(ProgressServerTest, DeliversValidRecordsAndCountsMalformedOnes) {
  const std::string path = ListenOk(3);
  const double before = NowSeconds();
  proto::ProgressClient client;
  ASSERT_TRUE(client.Connect(path).ok());
  ASSERT_TRUE(client.Report(R"({"step": 1, "loss": 2.5})").ok());
  ASSERT_TRUE(client.Report("not json at all").ok());
  ASSERT_TRUE(client.Report("[1, 2, 3]").ok());
  ASSERT_TRUE(client.Report("42").ok());
  ASSERT_TRUE(client.Report(R"({"step": 2})").ok());
  ASSERT_TRUE(RunUntil(io_, [&] {
    return delegate_.records.size() == 2 && delegate_.total_malformed() == 3;
  }));
  EXPECT_EQ(delegate_.Jsons(),
            (std::vector<std::string>{R"({"step": 1, "loss": 2.5})",
                                      R"({"step": 2})"}));
  for (const auto& record : delegate_.records) {
    EXPECT_EQ(record.rank, 3);
    EXPECT_GE(record.time, before - 1);
    EXPECT_LE(record.time, NowSeconds() + 1);
  }
  EXPECT_EQ(delegate_.malformed[3], 3);
  for (const Status& why : delegate_.reasons) {
    EXPECT_EQ(why.code(), StatusCode::kDataError);
  }
}

TEST_F(ProgressServerTest, DeliversLastRecordWithoutNewlineWhenRankCloses) {
  const std::string path = ListenOk(0);
  const int fd = ConnectRaw(path);
  ASSERT_GE(fd, 0);
  WriteRunning(fd, "{\"step\": 1}\n{\"step\": 2}");
  ::close(fd);
  ASSERT_TRUE(RunUntil(io_, [&] { return delegate_.records.size() == 2; }));
  EXPECT_EQ(delegate_.Jsons(),
            (std::vector<std::string>{R"({"step": 1})", R"({"step": 2})"}));
  EXPECT_EQ(delegate_.total_malformed(), 0);
}

TEST_F(ProgressServerTest, JoinsRecordWrittenInPieces) {
  const std::string path = ListenOk(0);
  const int fd = ConnectRaw(path);
  WriteRunning(fd, "{\"st");
  RunUntil(
      io_, [] { return false; }, std::chrono::milliseconds(20));
  EXPECT_TRUE(delegate_.records.empty());
  WriteRunning(fd, "ep\": 7}\n");
  ASSERT_TRUE(RunUntil(io_, [&] { return delegate_.records.size() == 1; }));
  EXPECT_EQ(delegate_.records[0].json, R"({"step": 7})");
  ::close(fd);
}

TEST_F(ProgressServerTest, AcceptsCrLfLineEnds) {
  const std::string path = ListenOk(0);
  const int fd = ConnectRaw(path);
  WriteRunning(fd, "{\"a\": 1}\r\n");
  ::close(fd);
  ASSERT_TRUE(RunUntil(io_, [&] { return delegate_.records.size() == 1; }));
  EXPECT_EQ(delegate_.records[0].json, R"({"a": 1})");
}

TEST_F(ProgressServerTest, IgnoresEmptyLines) {
  const std::string path = ListenOk(0);
  const int fd = ConnectRaw(path);
  WriteRunning(fd, "\n\n{}\n\n");
  ::close(fd);
  ASSERT_TRUE(RunUntil(io_, [&] { return delegate_.records.size() == 1; }));
  // Let the end of stream be processed too.
  RunUntil(
      io_, [] { return false; }, std::chrono::milliseconds(20));
  EXPECT_EQ(delegate_.total_malformed(), 0);
  EXPECT_EQ(delegate_.records.size(), 1u);
}

TEST_F(ProgressServerTest, CountsOversizedRecordOnceAndKeepsReading) {
  const std::string path = ListenOk(1);
  const int fd = ConnectRaw(path);
  std::string big = R"({"pad": ")" +
                    std::string(proto::kMaxProgressRecordBytes + 100, 'x') +
                    "\"}\n";
  WriteRunning(fd, big + "{\"after\": true}\n");
  ASSERT_TRUE(RunUntil(io_, [&] { return delegate_.records.size() == 1; }));
  EXPECT_EQ(delegate_.records[0].json, R"({"after": true})");
  EXPECT_EQ(delegate_.malformed[1], 1);
  ::close(fd);
}

TEST_F(ProgressServerTest, AcceptsRecordOfExactlyTheLimit) {
  const std::string path = ListenOk(0);
  const int fd = ConnectRaw(path);
  const std::string prefix = R"({"pad": ")";
  const std::string record =
      prefix +
      std::string(proto::kMaxProgressRecordBytes - prefix.size() - 2, 'x') +
      "\"}";
  ASSERT_EQ(record.size(), proto::kMaxProgressRecordBytes);
  WriteRunning(fd, record + "\n");
  ASSERT_TRUE(RunUntil(io_, [&] { return delegate_.records.size() == 1; }));
  EXPECT_EQ(delegate_.records[0].json, record);
  EXPECT_EQ(delegate_.total_malformed(), 0);
  ::close(fd);
}

TEST_F(ProgressServerTest, CountsOversizedRecordCutOffByCloseAsMalformed) {
  const std::string path = ListenOk(2);
  const int fd = ConnectRaw(path);
  WriteRunning(fd, std::string(proto::kMaxProgressRecordBytes + 1, '{'));
  ::close(fd);
  ASSERT_TRUE(RunUntil(io_, [&] { return delegate_.total_malformed() == 1; }));
  EXPECT_EQ(delegate_.malformed[2], 1);
  EXPECT_TRUE(delegate_.records.empty());
}

TEST_F(ProgressServerTest, TagsRecordsWithTheRankOfTheirSocket) {
  const std::string path0 = ListenOk(0);
  const std::string path1 = ListenOk(1);
  proto::ProgressClient client0, client1;
  ASSERT_TRUE(client1.Connect(path1).ok());
  ASSERT_TRUE(client0.Connect(path0).ok());
  ASSERT_TRUE(client1.Report(R"({"who": 1})").ok());
  ASSERT_TRUE(client0.Report(R"({"who": 0})").ok());
  ASSERT_TRUE(client0.Report("bad").ok());
  ASSERT_TRUE(RunUntil(io_, [&] {
    return delegate_.records.size() == 2 && delegate_.total_malformed() == 1;
  }));
  std::map<int, std::string> by_rank;
  for (const auto& record : delegate_.records)
    by_rank[record.rank] = record.json;
  EXPECT_EQ(by_rank[0], R"({"who": 0})");
  EXPECT_EQ(by_rank[1], R"({"who": 1})");
  EXPECT_EQ(delegate_.malformed[0], 1);
  EXPECT_EQ(delegate_.malformed.count(1), 0u);
}

TEST_F(ProgressServerTest, AcceptsSeveralConnectionsOnOneSocket) {
  const std::string path = ListenOk(0);
  proto::ProgressClient first, second;
  ASSERT_TRUE(first.Connect(path).ok());
  ASSERT_TRUE(second.Connect(path).ok());
  ASSERT_TRUE(first.Report(R"({"c": 1})").ok());
  ASSERT_TRUE(second.Report(R"({"c": 2})").ok());
  ASSERT_TRUE(RunUntil(io_, [&] { return delegate_.records.size() == 2; }));
}

TEST_F(ProgressServerTest, CreatesSocketOnlyItsOwnerCanUse) {
  const std::string path = ListenOk(0);
  struct stat st {};
  ASSERT_EQ(::stat(path.c_str(), &st), 0);
  EXPECT_TRUE(S_ISSOCK(st.st_mode));
  EXPECT_EQ(st.st_mode & 0777, 0600u);
}

TEST_F(ProgressServerTest, ReplacesStaleFileAtThePath) {
  const std::string path = SocketPath(0);
  { std::ofstream(path) << "stale"; }
  ListenOk(0);
  proto::ProgressClient client;
  EXPECT_TRUE(client.Connect(path).ok());
}

TEST_F(ProgressServerTest, CloseRemovesSocketFiles) {
  const std::string path = ListenOk(0);
  server_.Close();
  EXPECT_FALSE(std::filesystem::exists(path));
  proto::ProgressClient client;
  EXPECT_FALSE(client.Connect(path).ok());
}

TEST_F(ProgressServerTest, ListenFailsInMissingDirectory) {
  Status st = server_.Listen(0, dir_ + "/missing/progress.sock");
  EXPECT_FALSE(st.ok());
  EXPECT_NE(st.message().find("missing"), std::string::npos) << st.message();
}

TEST_F(ProgressServerTest, ARankHoldsAtMostSixteenConnections) {
  const std::string path = ListenOk(0);
  std::vector<int> fds;
  const size_t extra = 4;
  for (size_t i = 0; i < ProgressServer::kMaxConnectionsPerRank + extra; ++i) {
    fds.push_back(ConnectRaw(path));
  }
  auto closed_by_server = [](int fd) {
    char c;
    return ::recv(fd, &c, 1, MSG_DONTWAIT) == 0;
  };
  ASSERT_TRUE(RunUntil(io_, [&] {
    size_t n = 0;
    for (size_t i = 0; i < extra; ++i) n += closed_by_server(fds[i]);
    return n == extra;
  }));
  EXPECT_EQ(server_.open_connections(0),
            ProgressServer::kMaxConnectionsPerRank);
  for (size_t i = extra; i < fds.size(); ++i)
    EXPECT_FALSE(closed_by_server(fds[i]));
  for (int fd : fds) ::close(fd);
}

TEST(ProgressQueue, KeepsTheNewestRecordsOfAFloodingRankAndCountsTheRest) {
  ProgressQueue q;
  const int n = static_cast<int>(ProgressQueue::kMaxRecordsPerRank) + 100;
  for (int i = 0; i < n; ++i)
    q.Add(0, "{\"step\":" + std::to_string(i) + "}", i);
  q.Add(1, "{\"step\":7}", 1);
  std::vector<wire::Envelope> batches = q.Take();
  ASSERT_EQ(batches.size(), 1u);
  const wire::ProgressBatch& b = batches[0].progress_batch();
  EXPECT_EQ(b.dropped().at(0), 100);
  EXPECT_EQ(b.dropped().count(1), 0u);
  ASSERT_EQ(b.records_size(),
            static_cast<int>(ProgressQueue::kMaxRecordsPerRank) + 1);
  EXPECT_EQ(b.records(0).json(), "{\"step\":100}");  // the oldest kept
  EXPECT_EQ(b.records(b.records_size() - 2).json(),
            "{\"step\":" + std::to_string(n - 1) + "}");
  EXPECT_EQ(b.records(b.records_size() - 1).rank(), 1);
  EXPECT_EQ(q.dropped_total(), 100);
  EXPECT_TRUE(q.empty());
  EXPECT_TRUE(q.Take().empty());
}

TEST(ProgressQueue, BoundsTheBytesHeldPerRank) {
  ProgressQueue q;
  const std::string big(60 * 1024, 'x');
  for (int i = 0; i < 40; ++i) q.Add(2, big, i);  // 2.4 MB written
  size_t held = 0;
  for (const auto& e : q.Take(256 * 1024)) {
    EXPECT_LE(e.progress_batch().records_size(), 5);  // 256 KiB batches
    for (const auto& r : e.progress_batch().records()) held += r.json().size();
  }
  EXPECT_LE(held, ProgressQueue::kMaxBytesPerRank);
  EXPECT_EQ(q.dropped_total(), 40 - static_cast<int64_t>(held / big.size()));
}

TEST(ProgressQueue, SendsCountsEvenWithoutRecords) {
  ProgressQueue q;
  q.CountMalformed(3);
  q.CountMalformed(3);
  std::vector<wire::Envelope> batches = q.Take();
  ASSERT_EQ(batches.size(), 1u);
  EXPECT_EQ(batches[0].progress_batch().malformed().at(3), 2);
  EXPECT_EQ(batches[0].progress_batch().records_size(), 0);
}

}  // namespace
}  // namespace dslaunch::agent
