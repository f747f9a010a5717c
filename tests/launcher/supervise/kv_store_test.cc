#include "launcher/supervise/kv_store.h"

#include <gtest/gtest.h>

#include <boost/asio/io_context.hpp>
#include <cstdint>
#include <limits>
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

using Response = wire::StoreResponse;
constexpr int64_t kMax = std::numeric_limits<int64_t>::max();
constexpr int64_t kMin = std::numeric_limits<int64_t>::min();

class KvStoreTest : public ::testing::Test {
 protected:
  void Handle(const wire::StoreRequest& r) { Handle(store_, r); }
  void Handle(KvStore& store, const wire::StoreRequest& r) {
    store.Handle(r, [this](const wire::StoreResponse& resp) {
      replies_.push_back(resp);
    });
  }
  // The last reply, which must be a refusal with `code` whose text has
  // every one of `words`.
  void ExpectRefused(Response::ErrorCode code, std::vector<std::string> words) {
    ASSERT_FALSE(replies_.empty());
    const Response& r = replies_.back();
    EXPECT_FALSE(r.ok());
    EXPECT_EQ(r.code(), code) << r.error();
    for (const auto& w : words) {
      EXPECT_NE(r.error().find(w), std::string::npos)
          << "'" << w << "' not in: " << r.error();
    }
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

// ---- Signed overflow: ADD and timeouts have a defined result ----

TEST_F(KvStoreTest, AddPastInt64MaxIsRefusedAndKeepsTheValue) {
  Handle(Req(1, Op::ADD, {"n"}, "", kMax));
  ASSERT_TRUE(replies_[0].ok());
  Handle(Req(2, Op::ADD, {"n"}, "", 1));
  ExpectRefused(Response::INVALID, {"'n'", "overflows"});
  Handle(Req(3, Op::GET, {"n"}));
  EXPECT_EQ(replies_.back().value(), std::to_string(kMax));
}

TEST_F(KvStoreTest, AddBelowInt64MinIsRefusedAndKeepsTheValue) {
  Handle(Req(1, Op::SET, {"n"}, std::to_string(kMin + 1)));
  Handle(Req(2, Op::ADD, {"n"}, "", -1));
  EXPECT_EQ(replies_.back().value(), std::to_string(kMin));
  Handle(Req(3, Op::ADD, {"n"}, "", kMin));
  ExpectRefused(Response::INVALID, {"overflows"});
  Handle(Req(4, Op::GET, {"n"}));
  EXPECT_EQ(replies_.back().value(), std::to_string(kMin));
}

TEST_F(KvStoreTest, AddRefusesAValueThatIsNotWhollyAnInteger) {
  for (const char* bad : {"12abc", "99999999999999999999", "", " 1"}) {
    Handle(Req(1, Op::SET, {"s"}, bad));
    Handle(Req(2, Op::ADD, {"s"}, "", 1));
    ExpectRefused(Response::INVALID, {"does not hold a 64-bit integer"});
  }
}

TEST_F(KvStoreTest, HugeTimeoutWaitsInsteadOfExpiring) {
  Handle(Req(1, Op::GET, {"k"}, "", 0, kMax));
  Handle(Req(2, Op::WAIT, {"k"}, "", 0, kMax / 1000));
  io_.run_for(std::chrono::milliseconds(50));
  EXPECT_TRUE(replies_.empty());
  Handle(Req(3, Op::SET, {"k"}, "v"));
  ASSERT_EQ(replies_.size(), 3u);
  EXPECT_TRUE(replies_[1].ok());
  EXPECT_EQ(replies_[1].value(), "v");
  EXPECT_TRUE(replies_[2].ok());
}

TEST_F(KvStoreTest, NegativeTimeoutIsRefused) {
  Handle(Req(1, Op::GET, {"k"}, "", 0, -1));
  ExpectRefused(Response::INVALID, {"-1 ms is negative"});
  Handle(Req(2, Op::WAIT, {"k"}, "", 0, kMin));
  ExpectRefused(Response::INVALID, {"negative"});
  EXPECT_EQ(store_.parked(), 0u);
}

TEST_F(KvStoreTest, TimeoutNamesTheFirstMissingKey) {
  Handle(Req(1, Op::SET, {"a"}, "1"));
  Handle(Req(2, Op::WAIT, {"a", "b"}, "", 0, 10));
  io_.run_for(std::chrono::seconds(2));
  ExpectRefused(Response::TIMEOUT, {"'b'", "10 ms"});
}

// ---- Quota: every limit refuses with an error naming it ----

TEST_F(KvStoreTest, ValueOverTheMaximumIsRefusedNamingTheLimit) {
  KvStore store(io_, {.max_value_bytes = 1024});
  Handle(store, Req(1, Op::SET, {"big"}, std::string(1025, 'x')));
  ExpectRefused(Response::LIMIT,
                {"1025 bytes", "'big'", "1 KiB", "maximum value size"});
  Handle(store, Req(2, Op::SET, {"ok"}, std::string(1024, 'x')));
  EXPECT_TRUE(replies_.back().ok());
  EXPECT_EQ(store.size(), 1u);
}

TEST_F(KvStoreTest, KeyOverTheMaximumIsRefusedForEveryOperation) {
  KvStore store(io_, {.max_key_bytes = 8});
  const std::string long_key(9, 'k');
  for (auto op : {Op::SET, Op::GET, Op::WAIT, Op::ADD, Op::CHECK, Op::DELETE}) {
    Handle(store, Req(1, op, {long_key}, "v"));
    ExpectRefused(Response::LIMIT, {"'kkkkkkkkk'", "8 bytes", "maximum key"});
  }
  EXPECT_EQ(store.size(), 0u);
  EXPECT_EQ(store.parked(), 0u);
}

TEST_F(KvStoreTest, TotalQuotaRefusesTheSetThatWouldPassItAndDeleteFrees) {
  KvStore store(io_, {.max_total_bytes = 100});
  Handle(store, Req(1, Op::SET, {"a"}, std::string(59, 'x')));  // 60 bytes
  Handle(store, Req(2, Op::SET, {"b"}, std::string(40, 'x')));  // 101
  ExpectRefused(Response::LIMIT, {"'b'", "101 bytes", "quota of 100 bytes"});
  EXPECT_EQ(store.bytes(), 60u);
  Handle(store, Req(3, Op::SET, {"b"}, std::string(39, 'x')));  // 100
  EXPECT_TRUE(replies_.back().ok());
  Handle(store, Req(4, Op::SET, {"a"}, std::string(60, 'x')));  // grows
  ExpectRefused(Response::LIMIT, {"quota"});
  Handle(store, Req(5, Op::SET, {"a"}, "y"));  // shrinks
  EXPECT_TRUE(replies_.back().ok());
  Handle(store, Req(6, Op::DELETE, {"b"}));
  EXPECT_EQ(store.bytes(), 2u);
}

TEST_F(KvStoreTest, KeyCountLimitAppliesToSetAndAdd) {
  KvStore store(io_, {.max_keys = 2});
  Handle(store, Req(1, Op::SET, {"a"}, "1"));
  Handle(store, Req(2, Op::ADD, {"b"}, "", 1));
  Handle(store, Req(3, Op::SET, {"c"}, "1"));
  ExpectRefused(Response::LIMIT, {"2 keys", "'c'"});
  Handle(store, Req(4, Op::ADD, {"d"}, "", 1));
  ExpectRefused(Response::LIMIT, {"2 keys", "'d'"});
  Handle(store, Req(5, Op::SET, {"a"}, "replaced"));  // not a new key
  EXPECT_TRUE(replies_.back().ok());
  EXPECT_EQ(store.size(), 2u);
}

TEST_F(KvStoreTest, ParkedRequestsAreBounded) {
  KvStore store(io_, {.max_waiters = 2});
  Handle(store, Req(1, Op::GET, {"k"}));
  Handle(store, Req(2, Op::WAIT, {"k"}));
  Handle(store, Req(3, Op::GET, {"k"}));
  ExpectRefused(Response::LIMIT, {"2 requests already wait"});
  EXPECT_EQ(store.parked(), 2u);
  Handle(store, Req(4, Op::SET, {"k"}, "v"));  // answers both
  EXPECT_EQ(store.parked(), 0u);
  Handle(store, Req(5, Op::GET, {"other"}));
  EXPECT_EQ(store.parked(), 1u);
}

TEST_F(KvStoreTest, KeysPerRequestAreBounded) {
  KvStore store(io_, {.max_keys_per_request = 3});
  Handle(store, Req(1, Op::WAIT, {"a", "b", "c", "d"}));
  ExpectRefused(Response::LIMIT, {"4 keys", "at most 3"});
  Handle(store, Req(2, Op::CHECK, {"a", "b", "c", "d"}));
  ExpectRefused(Response::LIMIT, {"at most 3"});
  Handle(store, Req(3, Op::WAIT, {"a", "b", "c"}));
  EXPECT_EQ(store.parked(), 1u);
}

TEST_F(KvStoreTest, ParkedKeyBytesAreBoundedAndAParkedGetKeepsNoValue) {
  const size_t one = 10 + kStoreParkedKeyCost;
  KvStore store(io_, {.max_parked_bytes = 2 * one});
  const std::string key(10, 'k');
  Handle(store, Req(1, Op::GET, {key}, std::string(4096, 'v')));
  Handle(store, Req(2, Op::GET, {key}));
  EXPECT_EQ(store.parked_bytes(), 2 * one);
  Handle(store, Req(3, Op::GET, {key}));
  ExpectRefused(Response::LIMIT, {"waiting requests", "of keys"});
  store.FailAll("end");
  EXPECT_EQ(store.parked_bytes(), 0u);
  ExpectRefused(Response::CLOSED, {"end"});
}

TEST_F(KvStoreTest, DefaultLimitsLetAThousandRanksRendezvous) {
  // Every rank waits for every rank's address before any is stored, and
  // every rank but 0 waits for the NCCL id.
  constexpr int kRanks = 1024;
  std::vector<std::string> all;
  for (int r = 0; r < kRanks; ++r) {
    all.push_back("gloo/rank/" + std::to_string(r));
  }
  for (int r = 0; r < kRanks; ++r) Handle(Req(1, Op::WAIT, all));
  for (int r = 1; r < kRanks; ++r) {
    Handle(Req(r, Op::GET, {"nccl/unique_id"}, "", 0, 600000));
  }
  EXPECT_TRUE(replies_.empty());
  Handle(Req(kRanks, Op::SET, {"nccl/unique_id"}, std::string(128, 'u')));
  for (int r = 0; r < kRanks; ++r) {
    Handle(Req(1, Op::SET, {all[r]}, std::string(512, 'a')));
    Handle(Req(1, Op::ADD, {"arrived"}, "", 1));
  }
  EXPECT_EQ(replies_.size(), size_t{kRanks} * 4);
  for (const auto& r : replies_) ASSERT_TRUE(r.ok()) << r.error();
  EXPECT_EQ(store_.parked(), 0u);
  EXPECT_EQ(store_.parked_bytes(), 0u);
  EXPECT_LT(store_.bytes(), kStoreMaxTotalBytes / 100);
}

TEST_F(KvStoreTest, WaitSeesAKeyDeletedAfterItWasSet) {
  Handle(Req(1, Op::WAIT, {"a", "b"}));
  Handle(Req(2, Op::SET, {"a"}, "1"));
  Handle(Req(3, Op::DELETE, {"a"}));
  Handle(Req(4, Op::SET, {"b"}, "2"));
  EXPECT_EQ(replies_.size(), 3u);  // the WAIT still waits for "a"
  Handle(Req(5, Op::SET, {"a"}, "again"));
  ASSERT_EQ(replies_.size(), 5u);
  EXPECT_EQ(replies_[3].id(), 5u);
  EXPECT_EQ(replies_[4].id(), 1u);
  EXPECT_EQ(store_.parked(), 0u);
}

TEST_F(KvStoreTest, ExpiredWaitersLeaveNothingBehind) {
  for (int i = 0; i < 100; ++i) Handle(Req(i, Op::GET, {"never"}, "", 0, 1));
  io_.run_for(std::chrono::seconds(2));
  EXPECT_EQ(replies_.size(), 100u);
  EXPECT_EQ(store_.parked(), 0u);
  EXPECT_EQ(store_.parked_bytes(), 0u);
  Handle(Req(200, Op::SET, {"never"}, "now"));  // no stale waiter answered
  EXPECT_EQ(replies_.size(), 101u);
}

}  // namespace
}  // namespace dslaunch::launcher
