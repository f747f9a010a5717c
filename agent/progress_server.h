// ProgressServer listens on one Unix socket per local rank (the path in that
// rank's DSLAUNCH_PROGRESS) and turns what ranks write there into records:
// each newline-terminated JSON object is handed to the Delegate; anything
// else (not JSON, not an object, longer than the limit) is counted as
// malformed and dropped, never fatal. A rank holds at most
// kMaxConnectionsPerRank connections: a further one closes its oldest.
// Owned by the Agent; io_context thread.
#pragma once

#include <boost/asio/io_context.hpp>
#include <boost/asio/local/stream_protocol.hpp>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "base/line_splitter.h"
#include "base/status.h"
#include "proto/dslaunch.pb.h"

namespace dslaunch::agent {

class ProgressServer {
 public:
  class Delegate {
   public:
    virtual ~Delegate() = default;
    virtual void OnProgressRecord(int rank, std::string json, double time) = 0;
    virtual void OnMalformedProgress(int rank, const Status& why) = 0;
  };

  static constexpr size_t kMaxConnectionsPerRank = 16;

  ProgressServer(boost::asio::io_context& io, Delegate* delegate);
  ~ProgressServer();

  // Creates the socket at `path` (mode 0600) for `rank`.
  Status Listen(int rank, const std::string& path);
  // Stops accepting and reading; removes the socket files.
  void Close();
  // Connections of `rank` that are open now.
  size_t open_connections(int rank) const;

 private:
  struct Listener;
  struct Connection;
  void Accept(const std::shared_ptr<Listener>& l);
  void Read(const std::shared_ptr<Connection>& c);
  void CloseOldestBeyondLimit(int rank);
  void HandleBytes(Connection& c, std::string_view data);
  void HandlePiece(Connection& c, base::LineSplitter::Piece piece);
  void HandleLine(int rank, std::string_view line);

  boost::asio::io_context& io_;
  Delegate* delegate_;
  std::vector<std::shared_ptr<Listener>> listeners_;
  std::vector<std::weak_ptr<Connection>> connections_;
  std::shared_ptr<bool> alive_ = std::make_shared<bool>(true);
};

// ProgressQueue holds the progress records waiting to go to the launcher:
// at most kMaxRecordsPerRank records and kMaxBytesPerRank bytes per rank.
// When a rank is over either bound, its oldest record is dropped and counted
// (records are summaries: a newer one supersedes an older one). The counts
// of dropped and malformed records travel with the next batch. Owned by the
// Agent; io_context thread.
class ProgressQueue {
 public:
  static constexpr size_t kMaxRecordsPerRank = 256;
  static constexpr size_t kMaxBytesPerRank = 1u << 20;

  void Add(int rank, std::string json, double time);
  void CountMalformed(int rank) { ++ranks_[rank].malformed; }
  bool empty() const { return ranks_.empty(); }
  // Takes everything queued as ProgressBatch envelopes whose records total
  // at most `max_batch_bytes` each (at least one record each); the counts
  // ride in the first. Empty when nothing is queued.
  std::vector<wire::Envelope> Take(size_t max_batch_bytes = 1u << 20);
  int64_t dropped_total() const { return dropped_total_; }

 private:
  struct PerRank {
    std::deque<wire::ProgressBatch::Record> records;
    size_t bytes = 0;
    int64_t malformed = 0;
    int64_t dropped = 0;
  };
  std::map<int, PerRank> ranks_;
  int64_t dropped_total_ = 0;
};

}  // namespace dslaunch::agent
