#include "agent/progress_server.h"

#include <sys/stat.h>  // chmod
#include <unistd.h>    // unlink

#include <array>
#include <boost/asio/buffer.hpp>
#include <chrono>

#include "base/line_splitter.h"
#include "base/unix_time.h"
#include "proto/progress.h"

namespace dslaunch::agent {

namespace asio = boost::asio;
using Local = asio::local::stream_protocol;

struct ProgressServer::Listener {
  Listener(asio::io_context& io) : acceptor(io) {}
  int rank = 0;
  std::string path;
  Local::acceptor acceptor;
};

struct ProgressServer::Connection {
  Connection(asio::io_context& io) : socket(io) {}
  int rank = 0;
  Local::socket socket;
  std::array<char, 16 * 1024> buffer;
  base::LineSplitter lines{proto::kMaxProgressRecordBytes};
  bool discarding = false;  // inside an overlong record
};

ProgressServer::ProgressServer(asio::io_context& io, Delegate* delegate)
    : io_(io), delegate_(delegate) {}

ProgressServer::~ProgressServer() {
  Close();
  *alive_ = false;
}

Status ProgressServer::Listen(int rank, const std::string& path) {
  auto l = std::make_shared<Listener>(io_);
  l->rank = rank;
  l->path = path;
  boost::system::error_code ec;
  ::unlink(path.c_str());
  l->acceptor.open(Local(), ec);
  if (!ec) l->acceptor.bind(Local::endpoint(path), ec);
  if (!ec) l->acceptor.listen(asio::socket_base::max_listen_connections, ec);
  if (ec) return Internal("progress socket " + path + ": " + ec.message());
  ::chmod(path.c_str(), 0600);
  listeners_.push_back(l);
  Accept(l);
  return Status::Ok();
}

void ProgressServer::Accept(const std::shared_ptr<Listener>& l) {
  auto c = std::make_shared<Connection>(io_);
  c->rank = l->rank;
  l->acceptor.async_accept(c->socket, [this, l, c, alive = alive_](
                                          boost::system::error_code ec) {
    if (!*alive || ec == asio::error::operation_aborted) return;
    if (!ec) {
      std::erase_if(connections_, [](const auto& w) { return w.expired(); });
      CloseOldestBeyondLimit(c->rank);
      connections_.push_back(c);
      Read(c);
    }
    Accept(l);
  });
}

size_t ProgressServer::open_connections(int rank) const {
  size_t n = 0;
  for (const auto& weak : connections_) {
    auto c = weak.lock();
    if (c && c->rank == rank && c->socket.is_open()) ++n;
  }
  return n;
}

void ProgressServer::CloseOldestBeyondLimit(int rank) {
  if (open_connections(rank) < kMaxConnectionsPerRank) return;
  for (const auto& weak : connections_) {
    auto c = weak.lock();
    if (!c || c->rank != rank || !c->socket.is_open()) continue;
    boost::system::error_code ignored;
    c->socket.close(ignored);  // its read ends; a pending record still counts
    return;
  }
}

void ProgressServer::Read(const std::shared_ptr<Connection>& c) {
  c->socket.async_read_some(
      asio::buffer(c->buffer),
      [this, c, alive = alive_](boost::system::error_code ec, size_t n) {
        if (!*alive) return;
        if (ec) {
          // A last record without a newline still counts.
          std::string rest;
          if (c->lines.Finish(&rest)) {
            HandlePiece(*c, {std::move(rest), true});
          } else if (c->discarding) {
            HandlePiece(*c, {"", true});
          }
          return;
        }
        HandleBytes(*c, std::string_view(c->buffer.data(), n));
        Read(c);
      });
}

void ProgressServer::HandleBytes(Connection& c, std::string_view data) {
  std::vector<base::LineSplitter::Piece> pieces;
  c.lines.Feed(data, &pieces);
  for (auto& piece : pieces) HandlePiece(c, std::move(piece));
}

void ProgressServer::HandlePiece(Connection& c,
                                 base::LineSplitter::Piece piece) {
  // A piece that does not end its line is a record over the size limit:
  // the whole record is dropped and counted once, at its end.
  if (!piece.ends_line) {
    c.discarding = true;
    return;
  }
  if (c.discarding) {
    c.discarding = false;
    return delegate_->OnMalformedProgress(
        c.rank, DataError("progress record over the size limit"));
  }
  if (!piece.text.empty()) HandleLine(c.rank, piece.text);
}

void ProgressServer::HandleLine(int rank, std::string_view line) {
  if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
  std::string record = proto::NormalizeNonFinite(line);  // NaN, inf
  Status st = proto::ValidateProgressRecord(record);
  if (!st.ok()) return delegate_->OnMalformedProgress(rank, st);
  delegate_->OnProgressRecord(rank, std::move(record), base::UnixSeconds());
}

void ProgressServer::Close() {
  boost::system::error_code ignored;
  for (auto& l : listeners_) {
    l->acceptor.close(ignored);
    ::unlink(l->path.c_str());
  }
  listeners_.clear();
  for (auto& weak : connections_) {
    if (auto c = weak.lock()) c->socket.close(ignored);
  }
  connections_.clear();
}

void ProgressQueue::Add(int rank, std::string json, double time) {
  PerRank& r = ranks_[rank];
  wire::ProgressBatch::Record record;
  record.set_rank(rank);
  record.set_time(time);
  r.bytes += json.size();
  record.set_json(std::move(json));
  r.records.push_back(std::move(record));
  while (r.records.size() > kMaxRecordsPerRank || r.bytes > kMaxBytesPerRank) {
    r.bytes -= r.records.front().json().size();
    r.records.pop_front();
    ++r.dropped;
    ++dropped_total_;
  }
}

std::vector<wire::Envelope> ProgressQueue::Take(size_t max_batch_bytes) {
  std::vector<wire::Envelope> out;
  if (ranks_.empty()) return out;
  out.emplace_back();
  wire::ProgressBatch* batch = out.back().mutable_progress_batch();
  size_t bytes = 0;
  for (auto& [rank, r] : ranks_) {
    if (r.malformed) (*batch->mutable_malformed())[rank] = r.malformed;
    if (r.dropped) (*batch->mutable_dropped())[rank] = r.dropped;
  }
  for (auto& [rank, r] : ranks_) {
    for (auto& record : r.records) {
      if (bytes > 0 && bytes + record.json().size() > max_batch_bytes) {
        out.emplace_back();
        batch = out.back().mutable_progress_batch();
        bytes = 0;
      }
      bytes += record.json().size();
      *batch->add_records() = std::move(record);
    }
  }
  ranks_.clear();
  return out;
}

}  // namespace dslaunch::agent
