// libFuzzer target: the control protocol's framing. The input is a byte
// stream cut into chunks at fuzzer-chosen points and fed to FrameDecoder;
// the frames must equal those of one whole-stream decoder (chunking never
// changes the result), and each frame goes through ParseEnvelope, whose
// messages must survive an encode/decode round trip. Single-threaded.
#include <fuzzer/FuzzedDataProvider.h>
#include <google/protobuf/io/coded_stream.h>
#include <google/protobuf/io/zero_copy_stream_impl_lite.h>
#include <google/protobuf/stubs/logging.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "proto/frame_codec.h"

namespace {

using dslaunch::proto::FrameDecoder;

void Require(bool condition, const char* what) {
  if (!condition) {
    std::fprintf(stderr, "invariant broken: %s\n", what);
    std::abort();
  }
}

// Serialization with map entries sorted, so that equal messages (NaN fields
// included) give equal bytes.
std::string Canonical(const dslaunch::wire::Envelope& msg) {
  std::string out;
  google::protobuf::io::StringOutputStream stream(&out);
  google::protobuf::io::CodedOutputStream coded(&stream);
  coded.SetSerializationDeterministic(true);
  msg.SerializeToCodedStream(&coded);
  coded.Trim();
  return out;
}

void CheckEnvelope(const std::string& payload) {
  auto msg = dslaunch::proto::ParseEnvelope(payload);
  if (!msg.ok()) return;
  Require(dslaunch::proto::MessageName(*msg) != "none",
          "a parsed message has a name");
  const std::string frame = dslaunch::proto::EncodeFrame(*msg);
  FrameDecoder decoder;
  std::vector<std::string> frames;
  Require(decoder.Feed(frame, &frames).ok(), "an encoded frame decodes");
  Require(frames.size() == 1 && decoder.buffered() == 0, "one whole frame");
  auto again = dslaunch::proto::ParseEnvelope(frames[0]);
  Require(again.ok(), "a re-encoded message parses");
  Require(Canonical(*again) == Canonical(*msg), "round trip keeps the message");
}

}  // namespace

// libprotobuf logs one ERROR line per string field with invalid UTF-8; the
// launcher's handling of that is not what this target checks.
extern "C" int LLVMFuzzerInitialize(int*, char***) {
  google::protobuf::SetLogHandler(nullptr);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  FuzzedDataProvider input(data, size);
  // Small limits reach the "too large" path; 0 stands for the default.
  const size_t max_frame = input.ConsumeIntegralInRange<size_t>(0, 300);
  const std::vector<uint8_t> cuts =
      input.ConsumeBytes<uint8_t>(input.ConsumeIntegralInRange<size_t>(0, 16));
  const std::string stream = input.ConsumeRemainingBytesAsString();

  FrameDecoder whole(max_frame == 0 ? dslaunch::proto::kDefaultMaxFrameBytes
                                    : max_frame);
  std::vector<std::string> expected;
  const bool whole_ok = whole.Feed(stream, &expected).ok();

  FrameDecoder chunked(max_frame == 0 ? dslaunch::proto::kDefaultMaxFrameBytes
                                      : max_frame);
  std::vector<std::string> frames;
  bool chunked_ok = true;
  size_t pos = 0;
  for (size_t i = 0; pos < stream.size() && chunked_ok; ++i) {
    const size_t n = i < cuts.size() ? cuts[i] : stream.size() - pos;
    chunked_ok =
        chunked.Feed(std::string_view(stream).substr(pos, n), &frames).ok();
    pos += std::min(n, stream.size() - pos);
  }
  Require(whole_ok == chunked_ok, "chunking does not change failure");
  Require(frames == expected, "chunking does not change the frames");
  if (whole_ok) {
    size_t framed = whole.buffered();
    for (const auto& f : expected)
      framed += f.size() + dslaunch::proto::kFrameHeaderBytes;
    Require(framed == stream.size(), "every byte is in a frame or buffered");
    Require(whole.buffered() == chunked.buffered(), "same bytes held back");
  } else {
    Require(whole.failed() && !whole.Feed("x", &expected).ok(),
            "failure sticks");
  }
  for (const auto& payload : expected) CheckEnvelope(payload);
  return 0;
}
