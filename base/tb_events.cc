#include "base/tb_events.h"

#include <unistd.h>  // write, close, getpid, gethostname

#include <array>
#include <atomic>
#include <cerrno>
#include <cmath>    // floor
#include <cstring>  // strerror

#include "base/tensorboard_event.pb.h"  // tensorboard::Event

namespace dslaunch::base {
namespace {

// Reflected CRC-32C table (polynomial 0x1EDC6F41, reversed 0x82F63B78).
constexpr std::array<uint32_t, 256> MakeCrcTable() {
  std::array<uint32_t, 256> table{};
  for (uint32_t i = 0; i < 256; ++i) {
    uint32_t crc = i;
    for (int bit = 0; bit < 8; ++bit) {
      crc = (crc & 1) ? (crc >> 1) ^ 0x82F63B78u : crc >> 1;
    }
    table[i] = crc;
  }
  return table;
}
constexpr std::array<uint32_t, 256> kCrcTable = MakeCrcTable();

void AppendLittleEndian(uint64_t value, int bytes, std::string* out) {
  for (int i = 0; i < bytes; ++i) {
    out->push_back(static_cast<char>((value >> (8 * i)) & 0xff));
  }
}

std::string HostName() {
  char name[256] = {};
  if (::gethostname(name, sizeof name - 1) != 0 || name[0] == '\0') {
    return "localhost";
  }
  std::string host(name);
  for (char& c : host) {
    if (c == '/') c = '_';  // never a path separator in a file name
  }
  return host;
}

std::atomic<uint64_t> next_file_number{0};

// Opens a new file in `dir`; the counter moves on past names that exist.
StatusOr<std::pair<std::string, int>> OpenNewFile(const SafeDir& dir,
                                                  double wall_time) {
  const mode_t mode = PrivateFileMode(CurrentUmask());
  const std::string prefix =
      "events.out.tfevents." +
      std::to_string(static_cast<int64_t>(std::floor(wall_time))) + "." +
      HostName() + "." + std::to_string(::getpid()) + ".";
  for (int attempt = 0; attempt < 1000; ++attempt) {
    const std::string name = prefix + std::to_string(next_file_number++);
    bool exists = false;
    StatusOr<int> fd = dir.CreateNew(name, mode, &exists);
    if (fd.ok()) return std::make_pair(dir.path() + "/" + name, *fd);
    if (!exists) return fd.status();
  }
  return IoError("cannot create an event file in " + dir.path() +
                 ": every name tried exists");
}

}  // namespace

uint32_t Crc32cExtend(uint32_t crc, std::string_view data) {
  crc = ~crc;
  for (const char c : data) {
    crc = kCrcTable[(crc ^ static_cast<uint8_t>(c)) & 0xff] ^ (crc >> 8);
  }
  return ~crc;
}

uint32_t MaskedCrc32c(std::string_view data) {
  const uint32_t crc = Crc32c(data);
  return ((crc >> 15) | (crc << 17)) + 0xa282ead8u;
}

std::string TfRecord(std::string_view data) {
  std::string record;
  record.reserve(data.size() + 16);
  AppendLittleEndian(data.size(), 8, &record);
  AppendLittleEndian(MaskedCrc32c(record), 4, &record);
  record.append(data);
  AppendLittleEndian(MaskedCrc32c(data), 4, &record);
  return record;
}

Status CreateEventDir(const std::string& dir, const std::string& what) {
  return SafeDir::Open(dir, what).status();
}

StatusOr<std::unique_ptr<EventFileWriter>> EventFileWriter::Create(
    const std::string& dir, double wall_time, const std::string& what) {
  if (dir.empty()) return IoError(what + ": an empty directory name");
  ASSIGN_OR_RETURN(auto above, SafeDir::OpenParent(dir, what));
  ASSIGN_OR_RETURN(SafeDir run, above.first.Child(above.second));
  return Create(run, wall_time, what);
}

StatusOr<std::unique_ptr<EventFileWriter>> EventFileWriter::Create(
    const SafeDir& run, double wall_time, const std::string& what) {
  auto opened = OpenNewFile(run, wall_time);
  if (!opened.ok()) return opened.status().Annotate(what);
  std::unique_ptr<EventFileWriter> writer(
      new EventFileWriter(opened->first, opened->second));
  tensorboard::Event event;
  event.set_wall_time(wall_time);
  event.set_file_version(kFileVersion);
  writer->Append(event.SerializeAsString());
  writer->Flush();
  if (!writer->status().ok()) return writer->status();
  return writer;
}

EventFileWriter::~EventFileWriter() { Close(); }

void EventFileWriter::AddScalar(std::string_view tag, int64_t step,
                                double value, double wall_time) {
  tensorboard::Event event;
  event.set_wall_time(wall_time);
  event.set_step(step);
  tensorboard::Summary::Value* v = event.mutable_summary()->add_value();
  v->set_tag(std::string(tag));
  v->set_simple_value(static_cast<float>(value));
  Append(event.SerializeAsString());
}

void EventFileWriter::AddScalars(
    int64_t step, const std::vector<std::pair<std::string, double>>& scalars,
    double wall_time) {
  if (scalars.empty()) return;
  tensorboard::Event event;
  event.set_wall_time(wall_time);
  event.set_step(step);
  for (const auto& [tag, value] : scalars) {
    tensorboard::Summary::Value* v = event.mutable_summary()->add_value();
    v->set_tag(tag);
    v->set_simple_value(static_cast<float>(value));
  }
  Append(event.SerializeAsString());
}

void EventFileWriter::Append(const std::string& event_bytes) {
  if (fd_ < 0 || !status_.ok()) return;
  buffer_ += TfRecord(event_bytes);
  if (buffer_.size() >= kFlushBytes) WriteOut();
}

void EventFileWriter::Flush() {
  if (fd_ >= 0) WriteOut();
}

void EventFileWriter::WriteOut() {
  size_t done = 0;
  while (status_.ok() && done < buffer_.size()) {
    const ssize_t n =
        ::write(fd_, buffer_.data() + done, buffer_.size() - done);
    if (n > 0) {
      done += static_cast<size_t>(n);
    } else if (n == 0) {
      status_ = IoError("cannot write " + path_ + ": nothing written");
    } else if (errno != EINTR) {
      status_ = IoErrno("cannot write " + path_, errno);
    }
  }
  buffer_.clear();
  // One large event must not pin its memory.
  if (buffer_.capacity() > 2 * kFlushBytes) buffer_.shrink_to_fit();
}

void EventFileWriter::Close() {
  if (fd_ < 0) return;
  WriteOut();
  if (::close(fd_) != 0 && status_.ok()) {
    status_ = IoErrno("cannot write " + path_, errno);
  }
  fd_ = -1;
}

}  // namespace dslaunch::base
