// Length-delimited framing for the control and store protocols: each frame
// is a 4-byte big-endian payload length followed by the payload (one
// serialized wire::Envelope). FrameDecoder is a passive, single-threaded
// parser fed with whatever bytes arrived; it never allocates more than the
// maximum frame size for one frame.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"
#include "proto/dslaunch.pb.h"

namespace dslaunch::proto {

inline constexpr size_t kFrameHeaderBytes = 4;
inline constexpr size_t kDefaultMaxFrameBytes = 16u << 20;  // 16 MiB

// Appends one frame holding `payload` to `out`.
void AppendFrame(std::string_view payload, std::string* out);
// Serializes `msg` as one frame.
std::string EncodeFrame(const wire::Envelope& msg);

class FrameDecoder {
 public:
  explicit FrameDecoder(size_t max_frame_bytes = kDefaultMaxFrameBytes)
      : max_frame_bytes_(max_frame_bytes) {}

  // Consumes `data`; complete payloads are appended to `frames`. Returns an
  // error (and stays failed) on a frame whose declared length exceeds the
  // maximum or is zero.
  Status Feed(std::string_view data, std::vector<std::string>* frames);
  // Bytes of an unfinished frame held back, header included.
  size_t buffered() const { return buffer_.size(); }
  void set_max_frame_bytes(size_t n) { max_frame_bytes_ = n; }
  bool failed() const { return failed_; }

 private:
  size_t max_frame_bytes_;
  std::string buffer_;
  bool failed_ = false;
};

// Parses one payload as an Envelope with a set message; ProtocolError if
// the bytes are not a valid Envelope or carry no message.
StatusOr<wire::Envelope> ParseEnvelope(std::string_view payload);

// A name for the message an envelope carries ("hello", "log_batch", ...).
std::string MessageName(const wire::Envelope& msg);

}  // namespace dslaunch::proto
