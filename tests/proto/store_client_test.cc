#include "proto/store_client.h"

#include <gtest/gtest.h>

#include <string>

#include "proto/frame_codec.h"

namespace dslaunch::proto {
namespace {

using Response = wire::StoreResponse;

Response Failed(Response::ErrorCode code, const std::string& error) {
  Response r;
  r.set_ok(false);
  r.set_code(code);
  r.set_error(error);
  return r;
}

TEST(StoreError, LimitIsAnInvalidArgumentCarryingTheLaunchersText) {
  const std::string text =
      "store limit: value of 2097152 bytes for key 'x' is larger than 1 MiB "
      "(maximum value size)";
  Status st = StoreError(Failed(Response::LIMIT, text));
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(st.message(), text);
}

TEST(StoreError, EachCodeMapsToItsStatus) {
  EXPECT_EQ(StoreError(Failed(Response::TIMEOUT, "t")).code(),
            StatusCode::kDeadlineExceeded);
  EXPECT_EQ(StoreError(Failed(Response::INVALID, "i")).code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(StoreError(Failed(Response::CLOSED, "job ended")).code(),
            StatusCode::kUnavailable);
}

TEST(StoreError, WithoutACodeOnlyATimeoutMessageIsATimeout) {
  // Launchers older than the code field: the text decides, and a key that
  // happens to be called "timeout" does not make an error a timeout.
  EXPECT_EQ(StoreError(Failed(Response::UNSPECIFIED,
                              "timeout after 50 ms waiting for key 'k'"))
                .code(),
            StatusCode::kDeadlineExceeded);
  EXPECT_EQ(StoreError(Failed(Response::UNSPECIFIED,
                              "store key 'timeout' does not hold an integer"))
                .code(),
            StatusCode::kUnavailable);
}

TEST(StoreClient, RequestOverTheFrameLimitFailsBeforeSending) {
  StoreClient client;  // not connected: the size is checked first
  Status st = client.Set("big", std::string(kDefaultMaxFrameBytes, 'x'));
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("maximum frame"), std::string::npos)
      << st.message();
}

}  // namespace
}  // namespace dslaunch::proto
