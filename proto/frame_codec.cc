#include "proto/frame_codec.h"

#include <google/protobuf/stubs/logging.h>  // LogSilencer

namespace dslaunch::proto {

void AppendFrame(std::string_view payload, std::string* out) {
  const uint32_t n = static_cast<uint32_t>(payload.size());
  const char header[kFrameHeaderBytes] = {
      static_cast<char>(n >> 24), static_cast<char>(n >> 16),
      static_cast<char>(n >> 8), static_cast<char>(n)};
  out->append(header, kFrameHeaderBytes);
  out->append(payload);
}

std::string EncodeFrame(const wire::Envelope& msg) {
  std::string payload;
  DSL_CHECK(msg.SerializeToString(&payload));
  std::string out;
  out.reserve(kFrameHeaderBytes + payload.size());
  AppendFrame(payload, &out);
  return out;
}

static uint32_t ReadLength(const std::string& buf) {
  const auto* b = reinterpret_cast<const unsigned char*>(buf.data());
  return (uint32_t{b[0]} << 24) | (uint32_t{b[1]} << 16) |
         (uint32_t{b[2]} << 8) | uint32_t{b[3]};
}

Status FrameDecoder::Feed(std::string_view data,
                          std::vector<std::string>* frames) {
  if (failed_) return ProtocolError("decoder already failed");
  buffer_.append(data);
  size_t pos = 0;
  while (buffer_.size() - pos >= kFrameHeaderBytes) {
    const uint32_t len = ReadLength(buffer_.substr(pos, kFrameHeaderBytes));
    if (len == 0 || len > max_frame_bytes_) {
      failed_ = true;
      buffer_.clear();
      return ProtocolError("frame of " + std::to_string(len) +
                           " bytes (allowed 1.." +
                           std::to_string(max_frame_bytes_) + ")");
    }
    if (buffer_.size() - pos - kFrameHeaderBytes < len) break;
    frames->emplace_back(buffer_, pos + kFrameHeaderBytes, len);
    pos += kFrameHeaderBytes + len;
  }
  buffer_.erase(0, pos);
  return Status::Ok();
}

StatusOr<wire::Envelope> ParseEnvelope(std::string_view payload) {
  wire::Envelope msg;
  // A malformed message is reported through the status only: libprotobuf's
  // own log line (e.g. for invalid UTF-8) would reach the terminal.
  google::protobuf::LogSilencer silence;
  if (!msg.ParseFromArray(payload.data(), static_cast<int>(payload.size()))) {
    return ProtocolError("malformed message (" +
                         std::to_string(payload.size()) + " bytes)");
  }
  if (msg.msg_case() == wire::Envelope::MSG_NOT_SET) {
    return ProtocolError("message of unknown type");
  }
  return msg;
}

std::string MessageName(const wire::Envelope& msg) {
  const auto* field =
      wire::Envelope::descriptor()->FindFieldByNumber(msg.msg_case());
  return field ? field->name() : "none";
}

}  // namespace dslaunch::proto
