#include "base/http_head.h"

#include <gtest/gtest.h>

#include <string>

namespace dslaunch::base {
namespace {

TEST(HttpRequestHead, ReadsTheRequestLineAndEveryFieldWithLfOrCrlf) {
  for (const std::string eol : {"\r\n", "\n"}) {
    const std::string text = "PUT /global/rank_0?x=1 HTTP/1.1" + eol +
                             "Host: 127.0.0.1" + eol + "Content-Length:\t 5 " +
                             eol + eol;
    const auto head = ParseHttpRequestHead(text);
    ASSERT_TRUE(head.has_value()) << eol.size();
    EXPECT_EQ(head->method, "PUT");
    EXPECT_EQ(head->target, "/global/rank_0?x=1");
    ASSERT_EQ(head->fields.size(), 2u);
    EXPECT_EQ(head->fields[0].first, "Host");
    EXPECT_EQ(head->fields[0].second, "127.0.0.1");
    EXPECT_EQ(head->fields[1].first, "Content-Length");
    EXPECT_EQ(head->fields[1].second, "5");
  }
  ASSERT_TRUE(ParseHttpRequestHead("GET / HTTP/1.0").has_value());
}

TEST(HttpRequestHead, RefusesWhatIsNotARequestHead) {
  for (const char* bad :
       {"", "\r\n\r\n", "GET /", "GET / HTTP/2", "GET  / HTTP/1.1",
        "GET / HTTP/1.1 x", "GET x HTTP/1.1", "G:T / HTTP/1.1",
        "GET / HTTP/1.1\r\nno colon\r\n", "GET / HTTP/1.1\r\n: empty\r\n",
        "GET / HTTP/1.1\r\nbad name: x\r\n"}) {
    EXPECT_FALSE(ParseHttpRequestHead(bad).has_value()) << bad;
  }
}

TEST(HttpResponseHead, SaysTheStatusTheFieldsTheLengthAndTheClose) {
  EXPECT_EQ(HttpResponseHead(404, 0),
            "HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n"
            "Connection: close\r\n\r\n");
  EXPECT_EQ(HttpResponseHead(405, 12, "Allow: GET\r\n"),
            "HTTP/1.1 405 Method Not Allowed\r\nAllow: GET\r\n"
            "Content-Length: 12\r\nConnection: close\r\n\r\n");
  EXPECT_STREQ(HttpReason(599), "Internal Server Error");
  EXPECT_TRUE(EqualsNoCase("content-LENGTH", "Content-Length"));
  EXPECT_FALSE(EqualsNoCase("Content-Length", "Content-Lengt"));
}

}  // namespace
}  // namespace dslaunch::base
