// libFuzzer target: progress records. The input is one line as a rank
// writes it: ValidateProgressRecord (the agent's check), then for records it
// accepts, AnnotateProgressRecord (metrics.jsonl) and Console::Progress for
// rank 0 (the console's summary line), exactly the launcher's path. The
// annotated record must be a valid record again, carrying rank, node, time.
// The Console writes to /dev/null from its writer thread; libFuzzer's thread
// calls everything else.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

#include "launcher/report/console.h"
#include "proto/progress.h"

namespace {

void Require(bool condition, const char* what) {
  if (!condition) {
    std::fprintf(stderr, "invariant broken: %s\n", what);
    std::abort();
  }
}

dslaunch::launcher::Console& TheConsole() {
  static FILE* null = std::fopen("/dev/null", "w");
  static auto* console = new dslaunch::launcher::Console(null, null);
  return *console;
}

// Nesting depth of JSON text (brackets outside strings).
int Depth(std::string_view text) {
  int depth = 0, deepest = 0;
  bool in_string = false;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      if (c == '\\')
        ++i;
      else if (c == '"')
        in_string = false;
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      deepest = std::max(deepest, ++depth);
    } else if (c == ']' || c == '}') {
      --depth;
    }
  }
  return deepest;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  // As the agent does: non-finite words normalized, then checked.
  const std::string normalized = dslaunch::proto::NormalizeNonFinite(
      std::string_view(reinterpret_cast<const char*>(data), size));
  const std::string_view line(normalized);
  if (!dslaunch::proto::ValidateProgressRecord(line).ok()) return 0;
  Require(Depth(line) <= static_cast<int>(dslaunch::proto::kMaxProgressDepth),
          "an accepted record is within the nesting bound");
  const std::string annotated =
      dslaunch::proto::AnnotateProgressRecord(line, 3, "node-a", 12.5);
  Require(annotated.find('\n') == std::string::npos, "annotated is one line");
  auto record = nlohmann::json::parse(annotated, nullptr, false);
  Require(record.is_object(), "annotated record is an object");
  Require(record["rank"] == 3 && record["node"] == "node-a" &&
              record["time"] == 12.5,
          "annotation is set");
  TheConsole().Progress(0, line, 12.5);
  return 0;
}
