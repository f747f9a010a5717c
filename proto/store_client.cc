#include "proto/store_client.h"

#include <unistd.h>  // close

#include <charconv>  // from_chars

#include "base/unix_socket.h"
#include "proto/frame_codec.h"

namespace dslaunch::proto {

StoreClient::~StoreClient() {
  if (fd_ >= 0) ::close(fd_);
}

Status StoreClient::Connect(const std::string& address) {
  const std::string kPrefix = "unix:";
  if (address.rfind(kPrefix, 0) != 0) {
    return InvalidArgument("store address '" + address +
                           "' does not start with unix:");
  }
  ASSIGN_OR_RETURN(fd_,
                   base::ConnectUnixSocket(address.substr(kPrefix.size())));
  return Status::Ok();
}

Status StoreError(const wire::StoreResponse& response) {
  using R = wire::StoreResponse;
  switch (response.code()) {
    case R::TIMEOUT:
      return DeadlineExceeded(response.error());
    case R::LIMIT:
    case R::INVALID:
      return InvalidArgument(response.error());
    case R::CLOSED:
      return Unavailable(response.error());
    default:  // a launcher older than the code field: go by the text
      return Status(response.error().rfind("timeout", 0) == 0
                        ? StatusCode::kDeadlineExceeded
                        : StatusCode::kUnavailable,
                    response.error());
  }
}

StatusOr<wire::StoreResponse> StoreClient::Call(wire::StoreRequest request) {
  request.set_id(next_id_++);
  wire::Envelope env;
  *env.mutable_store_request() = std::move(request);
  // The agent would drop the connection on a frame over its maximum; say why
  // here instead.
  if (env.ByteSizeLong() + kFrameHeaderBytes > kDefaultMaxFrameBytes) {
    return InvalidArgument("store request of " +
                           std::to_string(env.ByteSizeLong()) +
                           " bytes is larger than the maximum frame of " +
                           std::to_string(kDefaultMaxFrameBytes) + " bytes");
  }
  if (fd_ < 0) return Unavailable("store client is not connected");
  RETURN_IF_ERROR(base::WriteAll(fd_, EncodeFrame(env)));
  std::string header, payload;
  RETURN_IF_ERROR(base::ReadExact(fd_, kFrameHeaderBytes, &header));
  const auto* b = reinterpret_cast<const unsigned char*>(header.data());
  const size_t len = (size_t{b[0]} << 24) | (size_t{b[1]} << 16) |
                     (size_t{b[2]} << 8) | size_t{b[3]};
  if (len == 0 || len > kDefaultMaxFrameBytes) {
    return ProtocolError("store reply frame of " + std::to_string(len) +
                         " bytes");
  }
  RETURN_IF_ERROR(base::ReadExact(fd_, len, &payload));
  ASSIGN_OR_RETURN(wire::Envelope reply, ParseEnvelope(payload));
  if (!reply.has_store_response()) {
    return ProtocolError("unexpected " + MessageName(reply) + " from store");
  }
  wire::StoreResponse response = reply.store_response();
  if (!response.ok()) return StoreError(response);
  return response;
}

static wire::StoreRequest Request(wire::StoreRequest::Op op,
                                  std::vector<std::string> keys) {
  wire::StoreRequest r;
  r.set_op(op);
  for (auto& k : keys) r.add_keys(std::move(k));
  return r;
}

Status StoreClient::Set(const std::string& key, const std::string& value) {
  auto r = Request(wire::StoreRequest::SET, {key});
  r.set_value(value);
  return Call(std::move(r)).status();
}

StatusOr<std::string> StoreClient::Get(const std::string& key,
                                       std::chrono::milliseconds timeout) {
  auto r = Request(wire::StoreRequest::GET, {key});
  r.set_timeout_ms(timeout.count());
  ASSIGN_OR_RETURN(wire::StoreResponse resp, Call(std::move(r)));
  return resp.value();
}

Status StoreClient::Wait(const std::vector<std::string>& keys,
                         std::chrono::milliseconds timeout) {
  auto r = Request(wire::StoreRequest::WAIT, keys);
  r.set_timeout_ms(timeout.count());
  return Call(std::move(r)).status();
}

StatusOr<int64_t> StoreClient::Add(const std::string& key, int64_t delta) {
  auto r = Request(wire::StoreRequest::ADD, {key});
  r.set_delta(delta);
  ASSIGN_OR_RETURN(wire::StoreResponse resp, Call(std::move(r)));
  const std::string& v = resp.value();
  int64_t value = 0;
  auto [end, ec] = std::from_chars(v.data(), v.data() + v.size(), value);
  if (ec != std::errc() || end != v.data() + v.size()) {
    return ProtocolError("store ADD answered '" + v + "', not an integer");
  }
  return value;
}

StatusOr<bool> StoreClient::Check(const std::vector<std::string>& keys) {
  ASSIGN_OR_RETURN(wire::StoreResponse resp,
                   Call(Request(wire::StoreRequest::CHECK, keys)));
  return resp.ready();
}

Status StoreClient::Delete(const std::string& key) {
  return Call(Request(wire::StoreRequest::DELETE, {key})).status();
}

}  // namespace dslaunch::proto
