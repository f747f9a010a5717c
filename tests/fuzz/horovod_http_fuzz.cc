// libFuzzer target: the Horovod rendezvous's request-head parser and its
// /proc/net/tcp reader (agent/horovod_http.h). Any input gets an answer:
// either a request that names one scope and one key of visible ASCII
// without '/', with a body within the limit, or a refusal with a reason.
// The same bytes read as a socket table never crash and find only what the
// table lists. Single-threaded.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>

#include "agent/horovod_http.h"

namespace {

void Require(bool condition, const char* what) {
  if (!condition) {
    std::fprintf(stderr, "invariant broken: %s\n", what);
    std::abort();
  }
}

bool IsSegment(const std::string& s) {
  if (s.empty()) return false;
  for (char c : s) {
    if (c <= 0x20 || c >= 0x7f || c == '/') return false;
  }
  return true;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view input(reinterpret_cast<const char*>(data), size);
  const auto r = dslaunch::agent::ParseHorovodRequestHead(input);
  if (r.status == 200) {
    Require(r.method == "GET" || r.method == "PUT" || r.method == "DELETE",
            "a served method");
    Require(IsSegment(r.scope) && IsSegment(r.key), "scope and key segments");
    Require(r.content_length <= dslaunch::agent::kHorovodMaxBodyBytes,
            "body within the limit");
    Require(r.why.empty(), "no reason for an accepted request");
  } else {
    Require(r.status >= 400 && r.status < 600, "an error status");
    Require(!r.why.empty(), "a refusal says why");
  }
  if (size >= 4) {
    const uint16_t local = static_cast<uint16_t>(data[0] | data[1] << 8);
    const uint16_t peer = static_cast<uint16_t>(data[2] | data[3] << 8);
    auto uid = dslaunch::agent::LoopbackPeerUid(input.substr(4), local, peer);
    if (!uid.ok()) Require(!uid.status().message().empty(), "says why");
  }
  return 0;
}
