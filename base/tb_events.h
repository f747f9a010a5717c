// TensorBoard event files: EventFileWriter writes one run's
// events.out.tfevents.* file (TFRecord records of Event messages, see
// base/tensorboard_event.proto) with scalars TensorBoard plots. A write
// error is kept, never thrown: the job goes on without its charts. Owned by
// whoever reports (the launcher's TensorBoardSink, dsworker's rank 0); one
// thread at a time.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "base/safe_files.h"
#include "base/status.h"

namespace dslaunch::base {

// CRC-32C (Castagnoli), as TFRecord uses it. Crc32cExtend continues `crc`
// (the CRC of the bytes before) over `data`; Crc32c("123456789") is
// 0xE3069283.
uint32_t Crc32cExtend(uint32_t crc, std::string_view data);
inline uint32_t Crc32c(std::string_view data) { return Crc32cExtend(0, data); }
// TFRecord's masked CRC: ((crc >> 15) | (crc << 17)) + 0xa282ead8.
uint32_t MaskedCrc32c(std::string_view data);
// One TFRecord: uint64 length (little-endian), masked CRC of those 8 bytes,
// the data, masked CRC of the data.
std::string TfRecord(std::string_view data);

// Opens `dir` by SafeDir's rule (base/safe_files.h), making what is
// missing with PrivateDirMode. `what` names the setting in messages
// ("--tensorboard"). An existing non-directory, or another user's, is an
// IoError.
Status CreateEventDir(const std::string& dir, const std::string& what);

class EventFileWriter {
 public:
  // Buffered events are written out when the buffer passes this size.
  static constexpr size_t kFlushBytes = 64 * 1024;
  static constexpr const char* kFileVersion = "brain.Event:2";

  // Opens `dir`'s parent by SafeDir's rule, then `dir` itself as the run
  // directory (SafeDir::Child: made if missing, never a symbolic link, this
  // user's), and creates the file in it as the overload below.
  static StatusOr<std::unique_ptr<EventFileWriter>> Create(
      const std::string& dir, double wall_time, const std::string& what);
  // Creates in `run` a new file
  // events.out.tfevents.<unix seconds>.<hostname>.<pid>.<n> (n counts the
  // files this process made, so none is ever overwritten; O_EXCL relative to
  // `run`'s descriptor, nothing opened by path), then writes the
  // file_version event stamped `wall_time` and flushes it.
  static StatusOr<std::unique_ptr<EventFileWriter>> Create(
      const SafeDir& run, double wall_time, const std::string& what);
  ~EventFileWriter();  // Close()
  EventFileWriter(const EventFileWriter&) = delete;
  EventFileWriter& operator=(const EventFileWriter&) = delete;

  // One event with one scalar (stored as float, as TensorBoard does).
  void AddScalar(std::string_view tag, int64_t step, double value,
                 double wall_time);
  // One event holding every scalar of `scalars` at `step`; none: nothing.
  void AddScalars(int64_t step,
                  const std::vector<std::pair<std::string, double>>& scalars,
                  double wall_time);
  void Flush();
  // Flushes and closes; later calls write nothing. Idempotent.
  void Close();
  // The first error ("cannot write PATH: strerror"); after it, events are
  // dropped. OK when none.
  const Status& status() const { return status_; }
  const std::string& path() const { return path_; }

 private:
  EventFileWriter(std::string path, int fd) : path_(std::move(path)), fd_(fd) {}
  void Append(const std::string& event_bytes);
  void WriteOut();

  std::string path_;
  int fd_;              // -1 once closed
  std::string buffer_;  // whole records not yet written
  Status status_;
};

}  // namespace dslaunch::base
