// Hostfile: the parsed list of hosts a job may run on (OpenMPI/DeepSpeed
// syntax: `host slots=N`).
// Plain value types built once by the launcher's main thread and then only
// read; ParseHostfile/LoadHostfile are pure functions, safe on any thread.
// Grammar: `host [slots=N] [max_slots=M] [port=P] [user=U]`, `#` comments,
// SLURM-style ranges `node[01-04,07]`; every error names `file:line`.
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"  // Status, StatusOr

namespace dslaunch::launcher {

// Limits on what one hostfile may ask for, so that a typo (`slots=2147483647`,
// `node[0-9999999]`) is an error naming the line instead of exhausting memory.
// Documented in the README and docs/decisions.md.
inline constexpr int kMaxSlotsPerHost = 1024;  // slots= and max_slots=
#ifdef DSL_FUZZ_MAX_HOSTS  // the fuzz target's scaled-down limit
                           // (docs/fuzzing.md)
inline constexpr int kMaxHosts = DSL_FUZZ_MAX_HOSTS;
#else
inline constexpr int kMaxHosts = 65536;  // ranges expanded
#endif
inline constexpr int kMaxTotalSlots = 1 << 20;      // = largest world size
inline constexpr size_t kMaxLineBytes = 64 * 1024;  // one hostfile line
inline constexpr size_t kMaxHostfileBytes = 16 * 1024 * 1024;
inline constexpr size_t kMaxUserLength = 256;  // user=
inline constexpr int kMaxRangeDigits = 9;      // each bound of node[lo-hi]

struct HostEntry {
  std::string host;
  int slots = 1;
  std::optional<int> max_slots;
  std::optional<int> port;          // ssh port override
  std::optional<std::string> user;  // ssh user override
  int line = 0;  // 1-based line in the file (for a range, the range's line)
};

struct Hostfile {
  std::string path;
  std::vector<HostEntry> hosts;  // file order, which is rank order
};

// Parses hostfile text; `path` is only used in error messages. Every error is
// a DataError whose message starts with "path:line: " (or "path: " for an
// error about the whole file, such as having no hosts).
StatusOr<Hostfile> ParseHostfile(std::string_view text,
                                 const std::string& path);

// Reads and parses the file; a missing or unreadable file is a DataError
// naming the path and strerror.
StatusOr<Hostfile> LoadHostfile(const std::string& path);

// SLURM's host ranges, as in a hostfile and in SLURM_JOB_NODELIST: each
// [...] group holds numbers and number ranges (`01-04,07`, zero padding
// kept), several groups multiply (`r[1-2]n[1-2]`: r1n1 r1n2 r2n1 r2n2).
// At most `room` names; DataError "malformed range '...': ..." otherwise.
StatusOr<std::vector<std::string>> ExpandHostRange(std::string_view host,
                                                   size_t room);
// A SLURM host list (`gpu-a[001-003,010],gpu-b7`): comma-separated host
// ranges, each expanded, every name a valid host name; at most `room`.
StatusOr<std::vector<std::string>> ExpandHostlist(std::string_view list,
                                                  size_t room = kMaxHosts);

// A host name as hosts are matched (the hostfile's duplicates, --include,
// --exclude): lower case, as DNS compares names.
std::string HostKey(std::string_view host);
// `s` quoted for an error message: bytes outside printable ASCII as \xNN (no
// raw control characters reach the terminal), cut after 300 bytes.
std::string Quoted(std::string_view s);

}  // namespace dslaunch::launcher
