#include "proto/channel.h"

#include <gtest/gtest.h>

#include <boost/asio/io_context.hpp>
#include <boost/asio/local/connect_pair.hpp>
#include <boost/asio/local/stream_protocol.hpp>
#include <boost/asio/read.hpp>
#include <boost/asio/write.hpp>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "proto/dslaunch.pb.h"
#include "proto/frame_codec.h"
#include "tests/common/run_until.h"

namespace dslaunch::proto {
namespace {

namespace asio = boost::asio;
using Local = asio::local::stream_protocol;

using dslaunch::testing::RunUntil;

// Runs every handler that is ready now, without waiting for more.
void RunReady(asio::io_context& io) {
  for (int i = 0; i < 5; ++i) {
    io.restart();
    io.poll();
  }
}

// What one channel reported through its handlers.
struct Recorder {
  std::vector<wire::Envelope> messages;
  std::vector<Status> closes;
  int drains = 0;
  // Messages received before the first on_close.
  size_t messages_at_close = 0;

  Channel::Handlers Handlers() {
    Channel::Handlers h;
    h.on_message = [this](wire::Envelope&& msg) {
      messages.push_back(std::move(msg));
    };
    h.on_close = [this](const Status& st) {
      if (closes.empty()) messages_at_close = messages.size();
      closes.push_back(st);
    };
    h.on_drain = [this] { ++drains; };
    return h;
  }
};

wire::Envelope Heartbeat(uint64_t seq) {
  wire::Envelope msg;
  msg.mutable_heartbeat()->set_seq(seq);
  return msg;
}

wire::Envelope StoreSet(size_t value_bytes) {
  wire::Envelope msg;
  wire::StoreRequest* req = msg.mutable_store_request();
  req->set_id(7);
  req->add_keys("key");
  req->set_value(std::string(value_bytes, 'v'));
  return msg;
}

std::string Header(uint32_t len) {
  return std::string{static_cast<char>(len >> 24), static_cast<char>(len >> 16),
                     static_cast<char>(len >> 8), static_cast<char>(len)};
}

class ChannelTest : public ::testing::Test {
 protected:
  ChannelTest() : left_(io_), right_(io_) {
    asio::local::connect_pair(left_, right_);
  }

  // The channel over the left end; the right end stays a raw socket.
  std::shared_ptr<Channel> StartLeft(Channel::Limits limits = {}) {
    auto ch =
        Channel::Create(Channel::Socket(std::move(left_)), "left", limits);
    ch->Start(left_rec_.Handlers());
    return ch;
  }
  // A channel over the right end too.
  std::shared_ptr<Channel> StartRight(Channel::Limits limits = {}) {
    auto ch =
        Channel::Create(Channel::Socket(std::move(right_)), "right", limits);
    ch->Start(right_rec_.Handlers());
    return ch;
  }
  // Writes raw bytes from the right end (blocking; small amounts only).
  void WriteRaw(const std::string& bytes) {
    asio::write(right_, asio::buffer(bytes));
  }

  asio::io_context io_;
  Recorder left_rec_;
  Recorder right_rec_;
  Local::socket left_;
  Local::socket right_;
};

TEST_F(ChannelTest, DeliversMessagesInOrder) {
  auto sender = StartLeft();
  auto receiver = StartRight();
  for (uint64_t i = 0; i < 200; ++i)
    ASSERT_TRUE(sender->Send(Heartbeat(i)).ok());
  ASSERT_TRUE(RunUntil(io_, [&] { return right_rec_.messages.size() == 200; }));
  for (uint64_t i = 0; i < 200; ++i) {
    ASSERT_TRUE(right_rec_.messages[i].has_heartbeat());
    EXPECT_EQ(right_rec_.messages[i].heartbeat().seq(), i);
  }
  EXPECT_TRUE(left_rec_.closes.empty());
  EXPECT_TRUE(right_rec_.closes.empty());
  EXPECT_EQ(receiver->peer(), "right");
}

TEST_F(ChannelTest, DeliversMessagesBothWays) {
  auto left = StartLeft();
  auto right = StartRight();
  ASSERT_TRUE(left->Send(Heartbeat(1)).ok());
  ASSERT_TRUE(right->Send(Heartbeat(2)).ok());
  ASSERT_TRUE(RunUntil(io_, [&] {
    return left_rec_.messages.size() == 1 && right_rec_.messages.size() == 1;
  }));
  EXPECT_EQ(left_rec_.messages[0].heartbeat().seq(), 2u);
  EXPECT_EQ(right_rec_.messages[0].heartbeat().seq(), 1u);
}

TEST_F(ChannelTest, DeliversMessagesLargerThanOneRead) {
  auto sender = StartLeft();
  StartRight();
  ASSERT_TRUE(sender->Send(StoreSet(3 << 20)).ok());
  ASSERT_TRUE(sender->Send(Heartbeat(9)).ok());
  ASSERT_TRUE(RunUntil(io_, [&] { return right_rec_.messages.size() == 2; }));
  EXPECT_EQ(right_rec_.messages[0].store_request().value(),
            std::string(3 << 20, 'v'));
  EXPECT_EQ(right_rec_.messages[1].heartbeat().seq(), 9u);
  EXPECT_EQ(sender->queued_bytes(), 0u);
}

TEST_F(ChannelTest, ClosesOnOversizedFrameWithProtocolErrorExactlyOnce) {
  Channel::Limits limits;
  limits.max_frame_bytes = 1024;
  auto ch = StartLeft(limits);
  WriteRaw(Header(1 << 20) + "some of the payload");
  ASSERT_TRUE(RunUntil(io_, [&] { return !left_rec_.closes.empty(); }));
  RunReady(io_);
  ASSERT_EQ(left_rec_.closes.size(), 1u);
  EXPECT_EQ(left_rec_.closes[0].code(), StatusCode::kProtocol);
  EXPECT_TRUE(left_rec_.messages.empty());
  EXPECT_TRUE(ch->closed());
  // The peer sees the connection go away.
  char byte;
  boost::system::error_code ec;
  right_.read_some(asio::buffer(&byte, 1), ec);
  EXPECT_TRUE(ec == asio::error::eof || ec == asio::error::connection_reset)
      << ec.message();
}

TEST_F(ChannelTest, DeliversFramesBeforeGarbageThenClosesWithProtocolError) {
  auto ch = StartLeft();
  WriteRaw(EncodeFrame(Heartbeat(1)) + EncodeFrame(Heartbeat(2)) +
           "GET / HTTP/1.1\r\nHost: x\r\n\r\n");
  ASSERT_TRUE(RunUntil(io_, [&] { return !left_rec_.closes.empty(); }));
  RunReady(io_);
  ASSERT_EQ(left_rec_.closes.size(), 1u);
  EXPECT_EQ(left_rec_.closes[0].code(), StatusCode::kProtocol);
  ASSERT_EQ(left_rec_.messages_at_close, 2u);
  EXPECT_EQ(left_rec_.messages[0].heartbeat().seq(), 1u);
  EXPECT_EQ(left_rec_.messages[1].heartbeat().seq(), 2u);
}

TEST_F(ChannelTest, ClosesOnFramePayloadThatIsNotAnEnvelope) {
  auto ch = StartLeft();
  WriteRaw(Header(12) + std::string(12, '\xff'));
  ASSERT_TRUE(RunUntil(io_, [&] { return !left_rec_.closes.empty(); }));
  RunReady(io_);
  ASSERT_EQ(left_rec_.closes.size(), 1u);
  EXPECT_EQ(left_rec_.closes[0].code(), StatusCode::kProtocol);
  EXPECT_TRUE(left_rec_.messages.empty());
}

TEST_F(ChannelTest, ClosesOnZeroLengthFrame) {
  auto ch = StartLeft();
  WriteRaw(Header(0));
  ASSERT_TRUE(RunUntil(io_, [&] { return !left_rec_.closes.empty(); }));
  EXPECT_EQ(left_rec_.closes[0].code(), StatusCode::kProtocol);
}

TEST_F(ChannelTest, ReportsPeerClosingThroughOnCloseOnce) {
  auto ch = StartLeft();
  WriteRaw(EncodeFrame(Heartbeat(5)));
  right_.close();
  ASSERT_TRUE(RunUntil(io_, [&] { return !left_rec_.closes.empty(); }));
  RunReady(io_);
  ASSERT_EQ(left_rec_.closes.size(), 1u);
  // A clean end of stream is not a protocol violation.
  EXPECT_NE(left_rec_.closes[0].code(), StatusCode::kProtocol);
  EXPECT_EQ(left_rec_.messages_at_close, 1u);
  EXPECT_TRUE(ch->closed());
}

TEST_F(ChannelTest, ReportsPeerClosingMidFrameAsProtocolError) {
  auto ch = StartLeft();
  WriteRaw(EncodeFrame(Heartbeat(5)).substr(0, 3));
  right_.close();
  ASSERT_TRUE(RunUntil(io_, [&] { return !left_rec_.closes.empty(); }));
  RunReady(io_);
  ASSERT_EQ(left_rec_.closes.size(), 1u);
  EXPECT_EQ(left_rec_.closes[0].code(), StatusCode::kProtocol);
}

TEST_F(ChannelTest, SendFailsAfterClose) {
  auto ch = StartLeft();
  ch->Close(Status::Ok());
  ASSERT_EQ(left_rec_.closes.size(), 1u);
  EXPECT_TRUE(left_rec_.closes[0].ok());
  EXPECT_TRUE(ch->closed());
  Status st = ch->Send(Heartbeat(1));
  EXPECT_EQ(st.code(), StatusCode::kUnavailable);
  ch->Close(Internal("again"));
  RunReady(io_);
  EXPECT_EQ(left_rec_.closes.size(), 1u);
}

TEST_F(ChannelTest, CloseDeliversTheGivenReason) {
  auto ch = StartLeft();
  ch->Close(ProtocolError("bad hello"));
  ASSERT_EQ(left_rec_.closes.size(), 1u);
  EXPECT_EQ(left_rec_.closes[0].code(), StatusCode::kProtocol);
  EXPECT_EQ(left_rec_.closes[0].message(), "bad hello");
}

TEST_F(ChannelTest, SendFailsAndClosesOverTheHardQueueLimit) {
  Channel::Limits limits;
  limits.soft_queue_bytes = 256;
  limits.hard_queue_bytes = 1024;
  auto ch = StartLeft(limits);
  // Nothing runs the io_context, so no write completes: the queue only grows.
  int sent = 0;
  Status st;
  for (; sent < 100; ++sent) {
    st = ch->Send(StoreSet(200));
    if (!st.ok()) break;
  }
  EXPECT_GE(sent, 2);
  EXPECT_LE(sent, 5);
  EXPECT_EQ(st.code(), StatusCode::kUnavailable);
  EXPECT_TRUE(ch->closed());
  ASSERT_EQ(left_rec_.closes.size(), 1u);
  EXPECT_EQ(left_rec_.closes[0].code(), StatusCode::kUnavailable);
  EXPECT_FALSE(ch->Send(Heartbeat(1)).ok());
  RunReady(io_);
  EXPECT_EQ(left_rec_.closes.size(), 1u);
}

TEST_F(ChannelTest, ReportsCongestionAndDrain) {
  Channel::Limits limits;
  limits.soft_queue_bytes = 1000;
  auto sender = StartLeft(limits);
  StartRight();
  for (int i = 0; i < 10; ++i) ASSERT_TRUE(sender->Send(StoreSet(500)).ok());
  EXPECT_TRUE(sender->congested());
  EXPECT_GT(sender->queued_bytes(), 1000u);
  ASSERT_TRUE(RunUntil(io_, [&] {
    return right_rec_.messages.size() == 10 && sender->queued_bytes() == 0;
  }));
  EXPECT_FALSE(sender->congested());
  EXPECT_EQ(left_rec_.drains, 1);
}

TEST_F(ChannelTest, RefusesMessageOverTheFrameLimitWithoutClosing) {
  Channel::Limits limits;
  limits.max_frame_bytes = 100;
  auto ch = StartLeft(limits);
  Status st = ch->Send(StoreSet(1000));
  EXPECT_EQ(st.code(), StatusCode::kInternal);
  EXPECT_NE(st.message().find("store_request"), std::string::npos)
      << st.message();
  EXPECT_FALSE(ch->closed());
  EXPECT_TRUE(ch->Send(Heartbeat(1)).ok());
}

TEST_F(ChannelTest, CloseAfterFlushDeliversQueuedMessagesThenCloses) {
  auto sender = StartLeft();
  StartRight();
  for (uint64_t i = 0; i < 5; ++i) ASSERT_TRUE(sender->Send(Heartbeat(i)).ok());
  ASSERT_TRUE(sender->Send(StoreSet(1 << 20)).ok());
  sender->CloseAfterFlush();
  ASSERT_TRUE(RunUntil(io_, [&] {
    return !left_rec_.closes.empty() && !right_rec_.closes.empty();
  }));
  RunReady(io_);
  ASSERT_EQ(left_rec_.closes.size(), 1u);
  EXPECT_TRUE(left_rec_.closes[0].ok()) << left_rec_.closes[0].message();
  EXPECT_TRUE(sender->closed());
  // The receiver got everything before it saw the end of the stream.
  ASSERT_EQ(right_rec_.messages_at_close, 6u);
  for (uint64_t i = 0; i < 5; ++i) {
    EXPECT_EQ(right_rec_.messages[i].heartbeat().seq(), i);
  }
  EXPECT_EQ(right_rec_.messages[5].store_request().value().size(), 1u << 20);
  ASSERT_EQ(right_rec_.closes.size(), 1u);
  EXPECT_NE(right_rec_.closes[0].code(), StatusCode::kProtocol);
}

TEST_F(ChannelTest, CloseAfterFlushWithEmptyQueueClosesAtOnce) {
  auto ch = StartLeft();
  ch->CloseAfterFlush();
  RunReady(io_);
  ASSERT_EQ(left_rec_.closes.size(), 1u);
  EXPECT_TRUE(left_rec_.closes[0].ok());
}

TEST_F(ChannelTest, HandlerMayCloseTheChannelFromOnMessage) {
  auto ch = Channel::Create(Channel::Socket(std::move(left_)), "left");
  std::vector<uint64_t> seen;
  int closes = 0;
  // Captures that live in the handler itself must survive the Close.
  auto tag = std::make_shared<std::string>("tag");
  Channel::Handlers h;
  h.on_message = [&seen, &ch, tag](wire::Envelope&& msg) {
    seen.push_back(msg.heartbeat().seq());
    ch->Close(Status::Ok());
    EXPECT_EQ(*tag, "tag");
  };
  h.on_close = [&closes](const Status&) { ++closes; };
  ch->Start(std::move(h));
  tag.reset();
  WriteRaw(EncodeFrame(Heartbeat(1)) + EncodeFrame(Heartbeat(2)));
  ASSERT_TRUE(RunUntil(io_, [&] { return closes > 0; }));
  RunReady(io_);
  EXPECT_EQ(seen, std::vector<uint64_t>{1});
  EXPECT_EQ(closes, 1);
}

// Disabled: OnWrite calls handlers_.on_drain() in place, and Close() resets
// handlers_, destroying the running handler (heap-use-after-free of its
// captures under ASan). on_message is copied before the call; on_drain is not.
TEST_F(ChannelTest, HandlerMayCloseTheChannelFromOnDrain) {
  Channel::Limits limits;
  limits.soft_queue_bytes = 100;
  auto sender =
      Channel::Create(Channel::Socket(std::move(left_)), "left", limits);
  StartRight();
  bool drained = false;
  const std::string capture(1000, 'c');  // puts the closure on the heap
  Channel::Handlers h;
  h.on_drain = [&sender, &drained, capture] {
    sender->Close(Status::Ok());
    drained = capture.size() == 1000;
  };
  sender->Start(std::move(h));
  for (int i = 0; i < 5; ++i) ASSERT_TRUE(sender->Send(StoreSet(500)).ok());
  ASSERT_TRUE(RunUntil(io_, [&] { return drained; }));
  EXPECT_TRUE(sender->closed());
}

TEST_F(ChannelTest, PausedChannelReadsNothingUntilResumed) {
  auto receiver = StartLeft();
  auto sender = StartRight();
  ASSERT_TRUE(sender->Send(Heartbeat(1)).ok());
  ASSERT_TRUE(RunUntil(io_, [&] { return left_rec_.messages.size() == 1; }));
  receiver->PauseReading();
  EXPECT_TRUE(receiver->reading_paused());
  // The read armed before the pause may still deliver one batch; after that
  // nothing more arrives while paused.
  ASSERT_TRUE(sender->Send(Heartbeat(2)).ok());
  RunReady(io_);
  const size_t before = left_rec_.messages.size();
  ASSERT_TRUE(sender->Send(Heartbeat(3)).ok());
  EXPECT_FALSE(RunUntil(
      io_, [&] { return left_rec_.messages.size() > before; },
      std::chrono::milliseconds(200)));
  receiver->ResumeReading();
  ASSERT_TRUE(RunUntil(io_, [&] { return left_rec_.messages.size() == 3; }));
  EXPECT_EQ(left_rec_.messages[2].heartbeat().seq(), 3u);
}

TEST_F(ChannelTest, SmallReadBufferStillJoinsLargeFramesAndCanGrow) {
  Channel::Limits small;
  small.read_buffer_bytes = 64;
  auto receiver = StartLeft(small);
  auto sender = StartRight();
  ASSERT_TRUE(sender->Send(StoreSet(10000)).ok());
  ASSERT_TRUE(RunUntil(io_, [&] { return left_rec_.messages.size() == 1; }));
  EXPECT_EQ(left_rec_.messages[0].store_request().value().size(), 10000u);
  receiver->SetLimits(Channel::Limits());
  ASSERT_TRUE(sender->Send(StoreSet(100000)).ok());
  ASSERT_TRUE(RunUntil(io_, [&] { return left_rec_.messages.size() == 2; }));
  EXPECT_TRUE(left_rec_.closes.empty());
}

TEST_F(ChannelTest, SetLimitsLowersTheFrameLimit) {
  auto receiver = StartLeft();
  auto sender = StartRight();
  Channel::Limits tight;
  tight.max_frame_bytes = 100;
  receiver->SetLimits(tight);
  ASSERT_TRUE(sender->Send(StoreSet(1000)).ok());
  ASSERT_TRUE(RunUntil(io_, [&] { return !left_rec_.closes.empty(); }));
  EXPECT_EQ(left_rec_.closes[0].code(), StatusCode::kProtocol);
}

}  // namespace
}  // namespace dslaunch::proto
