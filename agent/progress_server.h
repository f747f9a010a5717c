// ProgressServer listens on one Unix socket per local rank (the path in that
// rank's DSLAUNCH_PROGRESS) and turns what ranks write there into records:
// each newline-terminated JSON object is handed to the Delegate; anything
// else (not JSON, not an object, longer than the limit) is counted as
// malformed and dropped, never fatal. Owned by the Agent; io_context thread.
#pragma once

#include <boost/asio/io_context.hpp>
#include <boost/asio/local/stream_protocol.hpp>
#include <memory>
#include <string>
#include <vector>

#include "proto/status.h"

namespace dslaunch::agent {

class ProgressServer {
 public:
  class Delegate {
   public:
    virtual ~Delegate() = default;
    virtual void OnProgressRecord(int rank, std::string json, double time) = 0;
    virtual void OnMalformedProgress(int rank, const Status& why) = 0;
  };

  ProgressServer(boost::asio::io_context& io, Delegate* delegate);
  ~ProgressServer();

  // Creates the socket at `path` (mode 0600) for `rank`.
  Status Listen(int rank, const std::string& path);
  // Stops accepting and reading; removes the socket files.
  void Close();

 private:
  struct Listener;
  struct Connection;
  void Accept(const std::shared_ptr<Listener>& l);
  void Read(const std::shared_ptr<Connection>& c);
  void HandleBytes(Connection& c, std::string_view data);
  void HandleLine(int rank, std::string_view line);

  boost::asio::io_context& io_;
  Delegate* delegate_;
  std::vector<std::shared_ptr<Listener>> listeners_;
  std::vector<std::weak_ptr<Connection>> connections_;
  std::shared_ptr<bool> alive_ = std::make_shared<bool>(true);
};

}  // namespace dslaunch::agent
