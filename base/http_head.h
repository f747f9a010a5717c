// HTTP/1.x as dslaunch's two small servers speak it (the launcher's metrics
// endpoint, the agent's Horovod rendezvous): a request head read into its
// parts, and the head of a one-shot response (Content-Length, then the
// connection closes). Pure functions; any thread.
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace dslaunch::base {

// Views into the text given to ParseHttpRequestHead.
struct HttpRequestHead {
  std::string_view method;  // a token: GET, PUT, ...
  std::string_view target;  // starts with '/'
  // Every header line's name and value (spaces and tabs around it trimmed),
  // in order.
  std::vector<std::pair<std::string_view, std::string_view>> fields;
};

// `head` is the request line and the header lines, each ending in LF or
// CRLF, up to the blank line (or the end). Nothing when it is malformed: a
// request line other than "TOKEN /TARGET HTTP/1.0|1.1", or a header line
// without a token name and a colon.
std::optional<HttpRequestHead> ParseHttpRequestHead(std::string_view head);

// The standard reason phrase of the status codes these servers send
// ("Internal Server Error" for any other).
const char* HttpReason(int code);

// "HTTP/1.1 CODE REASON", `fields` (complete header lines, each ending in
// CRLF), "Content-Length: N", "Connection: close" and the blank line.
std::string HttpResponseHead(int code, size_t content_length,
                             std::string_view fields = "");

// ASCII case-insensitive equality, for header names.
bool EqualsNoCase(std::string_view a, std::string_view b);

}  // namespace dslaunch::base
