// What every rank runs: PROGRAM ARGS as given, or, for a Python script, the
// launcher's interpreter in front of it, as DeepSpeed's launcher does. Pure;
// main thread.
#pragma once

#include <string>
#include <vector>

#include "base/status.h"

namespace dslaunch::launcher {

struct RankCommand {
  std::vector<std::string> argv;  // the same on every rank, byte-exact
  // Where `--local_rank=N` goes: before argv[local_rank_at] (argv.size():
  // at the end), or nowhere when -1 (--no_local_rank).
  int local_rank_at = -1;
};

struct RankCommandInputs {
  std::vector<std::string> program;  // PROGRAM ARGS... from the command line
  bool no_python = false;            // --no_python: run PROGRAM as given
  bool module = false;               // -m/--module: PYTHON -u -m PROGRAM
  bool no_local_rank = false;
  std::string dslaunch_python;  // $DSLAUNCH_PYTHON ("" = unset)
  std::string path;             // the launcher's $PATH
};

// The rank command:
//   PROGRAM ends in ".py"  -> PYTHON -u PROGRAM --local_rank=N ARGS...
//   --module               -> PYTHON -u -m PROGRAM --local_rank=N ARGS...
//   --no_python            -> PROGRAM --local_rank=N ARGS...
//   anything else          -> PROGRAM ARGS... --local_rank=N
// (DeepSpeed's order, the flag right after the script, wherever DeepSpeed
// defines one; a program DeepSpeed would not run, such as `dsworker`, keeps
// dslaunch's own order.) PYTHON is $DSLAUNCH_PYTHON, else the absolute path
// of the first python3 on PATH, kept as found: a venv's bin/python3 is a
// link out of the venv, and following it would leave the venv.
// InvalidArgument (exit 64) when --no_python and --module are both given or
// no interpreter is found.
StatusOr<RankCommand> MakeRankCommand(const RankCommandInputs& in);

}  // namespace dslaunch::launcher
