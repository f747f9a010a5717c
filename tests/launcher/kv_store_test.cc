#include "launcher/kv_store.h"

#include <gtest/gtest.h>

#include <boost/asio/io_context.hpp>
#include <vector>

namespace dslaunch::launcher {
namespace {

using Op = wire::StoreRequest;

wire::StoreRequest Req(uint64_t id, Op::Op op, std::vector<std::string> keys,
                       std::string value = "", int64_t delta = 0,
                       int64_t timeout_ms = 0) {
  wire::StoreRequest r;
  r.set_id(id);
  r.set_op(op);
  for (auto& k : keys) r.add_keys(k);
  r.set_value(value);
  r.set_delta(delta);
  r.set_timeout_ms(timeout_ms);
  return r;
}

class KvStoreTest : public ::testing::Test {
 protected:
  void Handle(const wire::StoreRequest& r) {
    store_.Handle(r, [this](const wire::StoreResponse& resp) {
      replies_.push_back(resp);
    });
  }
  boost::asio::io_context io_;
  KvStore store_{io_};
  std::vector<wire::StoreResponse> replies_;
};

TEST_F(KvStoreTest, SetThenGetAnswersAtOnce) {
  Handle(Req(1, Op::SET, {"k"}, "v"));
  Handle(Req(2, Op::GET, {"k"}));
  ASSERT_EQ(replies_.size(), 2u);
  EXPECT_TRUE(replies_[1].ok());
  EXPECT_EQ(replies_[1].id(), 2u);
  EXPECT_EQ(replies_[1].value(), "v");
}

TEST_F(KvStoreTest, GetBlocksUntilTheKeyIsSet) {
  Handle(Req(1, Op::GET, {"k"}));
  EXPECT_TRUE(replies_.empty());
  Handle(Req(2, Op::SET, {"k"}, "late"));
  ASSERT_EQ(replies_.size(), 2u);
  EXPECT_EQ(replies_[1].id(), 1u);
  EXPECT_EQ(replies_[1].value(), "late");
}

TEST_F(KvStoreTest, WaitNeedsEveryKey) {
  Handle(Req(1, Op::WAIT, {"a", "b"}));
  Handle(Req(2, Op::SET, {"a"}, "1"));
  ASSERT_EQ(replies_.size(), 1u);  // only the SET
  Handle(Req(3, Op::SET, {"b"}, "2"));
  ASSERT_EQ(replies_.size(), 3u);
  EXPECT_EQ(replies_[2].id(), 1u);
  EXPECT_TRUE(replies_[2].ok());
}

TEST_F(KvStoreTest, GetTimesOutWithTheKeyNamed) {
  Handle(Req(1, Op::GET, {"missing"}, "", 0, 20));
  io_.run_for(std::chrono::seconds(2));
  ASSERT_EQ(replies_.size(), 1u);
  EXPECT_FALSE(replies_[0].ok());
  EXPECT_NE(replies_[0].error().find("timeout"), std::string::npos);
  EXPECT_NE(replies_[0].error().find("'missing'"), std::string::npos);
}

TEST_F(KvStoreTest, AddCountsFromZeroAndRejectsNonIntegers) {
  Handle(Req(1, Op::ADD, {"n"}, "", 5));
  Handle(Req(2, Op::ADD, {"n"}, "", -2));
  EXPECT_EQ(replies_[0].value(), "5");
  EXPECT_EQ(replies_[1].value(), "3");
  Handle(Req(3, Op::SET, {"s"}, "text"));
  Handle(Req(4, Op::ADD, {"s"}, "", 1));
  EXPECT_FALSE(replies_[3].ok());
}

TEST_F(KvStoreTest, CheckAndDelete) {
  Handle(Req(1, Op::SET, {"a"}, "1"));
  Handle(Req(2, Op::CHECK, {"a"}));
  Handle(Req(3, Op::DELETE, {"a"}));
  Handle(Req(4, Op::CHECK, {"a"}));
  EXPECT_TRUE(replies_[1].ready());
  EXPECT_FALSE(replies_[3].ready());
}

TEST_F(KvStoreTest, RejectsWrongKeyCount) {
  Handle(Req(1, Op::SET, {"a", "b"}, "1"));
  Handle(Req(2, Op::WAIT, {}));
  EXPECT_FALSE(replies_[0].ok());
  EXPECT_FALSE(replies_[1].ok());
}

TEST_F(KvStoreTest, FailAllAnswersEveryParkedRequestOnce) {
  Handle(Req(1, Op::GET, {"x"}, "", 0, 100000));
  Handle(Req(2, Op::WAIT, {"y"}));
  store_.FailAll("job ended");
  ASSERT_EQ(replies_.size(), 2u);
  EXPECT_EQ(replies_[0].error(), "job ended");
  io_.run_for(std::chrono::milliseconds(50));
  EXPECT_EQ(replies_.size(), 2u);
}

}  // namespace
}  // namespace dslaunch::launcher
