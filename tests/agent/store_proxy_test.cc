#include "agent/store_proxy.h"

#include <gtest/gtest.h>
#include <stdlib.h>  // mkdtemp

#include <boost/asio/io_context.hpp>
#include <boost/asio/local/stream_protocol.hpp>
#include <chrono>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "proto/channel.h"
#include "tests/common/run_until.h"

namespace dslaunch::agent {
namespace {

namespace asio = boost::asio;
using Local = asio::local::stream_protocol;
using dslaunch::testing::RunUntil;

class StoreProxyTest : public ::testing::Test {
 protected:
  StoreProxyTest()
      : proxy_(io_, [this](const wire::StoreRequest& r) {
          forwarded_.push_back(r);
          return Status::Ok();
        }) {
    char tmpl[] = "/tmp/dsl-store-XXXXXX";
    dir_ = ::mkdtemp(tmpl);
    EXPECT_TRUE(proxy_.Listen(dir_ + "/store.sock").ok());
  }
  ~StoreProxyTest() override {
    proxy_.Close();
    std::filesystem::remove_all(dir_);
  }
  std::shared_ptr<proto::Channel> Client() {
    Local::socket s(io_);
    s.connect(Local::endpoint(dir_ + "/store.sock"));
    auto c =
        proto::Channel::Create(proto::Channel::Socket(std::move(s)), "rank");
    c->Start(
        {.on_message = [this](wire::Envelope&& m) { replies_.push_back(m); },
         .on_close = nullptr,
         .on_drain = nullptr});
    return c;
  }
  static wire::Envelope Get(uint64_t id) {
    wire::Envelope env;
    env.mutable_store_request()->set_id(id);
    env.mutable_store_request()->add_keys("k");
    return env;
  }

  asio::io_context io_;
  std::vector<wire::StoreRequest> forwarded_;
  std::vector<wire::Envelope> replies_;
  StoreProxy proxy_;
  std::string dir_;
};

TEST_F(StoreProxyTest, PausedProxyForwardsNothingUntilResumed) {
  auto early = Client();
  ASSERT_TRUE(early->Send(Get(1)).ok());
  ASSERT_TRUE(RunUntil(io_, [&] { return forwarded_.size() == 1; }));
  proxy_.PauseReading();
  auto late = Client();  // connects while paused
  ASSERT_TRUE(early->Send(Get(2)).ok());
  ASSERT_TRUE(late->Send(Get(3)).ok());
  EXPECT_FALSE(RunUntil(
      io_, [&] { return forwarded_.size() > 1; },
      std::chrono::milliseconds(200)));
  proxy_.ResumeReading();
  ASSERT_TRUE(RunUntil(io_, [&] { return forwarded_.size() == 3; }));
}

TEST_F(StoreProxyTest, RoutesTheResponseBackUnderTheClientsId) {
  auto c = Client();
  ASSERT_TRUE(c->Send(Get(42)).ok());
  ASSERT_TRUE(RunUntil(io_, [&] { return forwarded_.size() == 1; }));
  wire::StoreResponse r;
  r.set_id(forwarded_[0].id());
  r.set_ok(true);
  proxy_.HandleResponse(r);
  ASSERT_TRUE(RunUntil(io_, [&] { return replies_.size() == 1; }));
  EXPECT_EQ(replies_[0].store_response().id(), 42u);
}

}  // namespace
}  // namespace dslaunch::agent
