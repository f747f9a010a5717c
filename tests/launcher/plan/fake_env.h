// A fake environment for the plan stage's tests: only `vars` are set.
#pragma once

#include <map>
#include <string>

#include "launcher/plan/slurm_allocation.h"  // EnvLookup

namespace dslaunch::launcher {

inline EnvLookup FakeEnv(std::map<std::string, std::string> vars) {
  return [vars = std::move(vars)](const char* name) {
    auto it = vars.find(name);
    return it == vars.end() ? std::string() : it->second;
  };
}

}  // namespace dslaunch::launcher
