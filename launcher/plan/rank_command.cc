#include "launcher/plan/rank_command.h"

#include <filesystem>

#include "base/process_set.h"  // ResolveProgram

namespace dslaunch::launcher {

namespace fs = std::filesystem;

// The first python3 on `path` as an absolute path, links not followed
// ("" = none).
static std::string FindPython(const std::string& path) {
  StatusOr<std::string> found = base::ResolveProgram("python3", path);
  if (!found.ok()) return "";
  std::error_code ec;
  const fs::path absolute = fs::absolute(*found, ec);
  return ec ? *found : absolute.lexically_normal().string();
}

static bool EndsWith(const std::string& s, const std::string& tail) {
  return s.size() >= tail.size() &&
         s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}

StatusOr<RankCommand> MakeRankCommand(const RankCommandInputs& in) {
  if (in.no_python && in.module) {
    return InvalidArgument(
        "--no_python and --module cannot be used together (--module runs "
        "PROGRAM as a Python module)");
  }
  if (in.program.empty()) return RankCommand{};
  const bool python =
      !in.no_python && (in.module || EndsWith(in.program.front(), ".py"));
  RankCommand cmd;
  if (python) {
    std::string interpreter = in.dslaunch_python;
    if (interpreter.empty()) interpreter = FindPython(in.path);
    if (interpreter.empty()) {
      return InvalidArgument(
          "no python3 on PATH to run " + in.program.front() +
          " with (activate the environment, set DSLAUNCH_PYTHON, or pass "
          "--no_python to run it as it is)");
    }
    cmd.argv = {interpreter, "-u"};
    if (in.module) cmd.argv.push_back("-m");
  }
  cmd.argv.push_back(in.program.front());
  const bool deepspeed_order = python || in.no_python;
  const int after_program = static_cast<int>(cmd.argv.size());
  cmd.argv.insert(cmd.argv.end(), in.program.begin() + 1, in.program.end());
  if (!in.no_local_rank) {
    cmd.local_rank_at =
        deepspeed_order ? after_program : static_cast<int>(cmd.argv.size());
  }
  return cmd;
}

}  // namespace dslaunch::launcher
