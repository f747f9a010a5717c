#include "proto/progress.h"

#include <unistd.h>  // close

#include <nlohmann/json.hpp>  // parsing and re-serializing records

#include "proto/unix_socket.h"

namespace dslaunch::proto {

Status ValidateProgressRecord(std::string_view line) {
  if (line.size() > kMaxProgressRecordBytes) {
    return DataError("progress record of " + std::to_string(line.size()) +
                     " bytes (limit " +
                     std::to_string(kMaxProgressRecordBytes) + ")");
  }
  auto parsed =
      nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
  if (parsed.is_discarded()) return DataError("progress record is not JSON");
  if (!parsed.is_object()) {
    return DataError("progress record is not a JSON object");
  }
  return Status::Ok();
}

std::string AnnotateProgressRecord(std::string_view json, int rank,
                                   const std::string& node, double time) {
  auto record = nlohmann::ordered_json::parse(json, nullptr, false);
  if (!record.is_object()) record = nlohmann::ordered_json::object();
  record["rank"] = rank;
  record["node"] = node;
  record["time"] = time;
  return record.dump(-1, ' ', false,
                     nlohmann::ordered_json::error_handler_t::replace);
}

ProgressClient::~ProgressClient() {
  if (fd_ >= 0) ::close(fd_);
}

Status ProgressClient::Connect(const std::string& path) {
  ASSIGN_OR_RETURN(fd_, ConnectUnixSocket(path));
  return Status::Ok();
}

Status ProgressClient::Report(std::string_view json) {
  if (fd_ < 0) return Unavailable("progress client is not connected");
  std::string line(json);
  line.push_back('\n');
  return WriteAll(fd_, line);
}

}  // namespace dslaunch::proto
