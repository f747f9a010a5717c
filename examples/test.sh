#!/usr/bin/env bash
# The whole test suite: installs what it needs (Debian 12, as root), builds,
# and runs every ctest label that this machine supports (unit, integration;
# cluster, slurm, pods and gpu tests skip themselves with a message when they
# cannot run).
set -euo pipefail
cd "$(dirname "$0")/.."
# Each phase says how long it took: CI has 90 minutes for all of them.
phase_start=$SECONDS
phase_done() {
  echo "test.sh: $1 took $((SECONDS - phase_start)) s ($SECONDS s in all)"
  phase_start=$SECONDS
}
bash deploy/setup.sh --test
# The CUDA engine compiles wherever nvcc is: a CUDA build break fails here,
# not first on a GPU machine.
if command -v nvcc >/dev/null || [ -x /usr/local/cuda/bin/nvcc ]; then
  [ -f build/bin/libdsl_cuda.so ] ||
    { echo "test.sh: nvcc is here but build/bin/libdsl_cuda.so was not built" >&2; exit 1; }
fi
phase_done "setup and build"
# The Debian packages and the wheel, from that build (tests/deploy installs
# and runs them).
bash deploy/packages.sh
phase_done "packages"
ctest --test-dir build --output-on-failure -j 2 "$@"
phase_done "ctest"

# Every library's unit tests again, under AddressSanitizer and
# UndefinedBehaviorSanitizer, from their own build dir (DSL_TEST_SANITIZE=0
# skips this). Only the unit-test targets are built, with line tables only
# (-g1: stack traces keep file and line), at -O0 but for dsworker's library
# (its own -O3, worker/CMakeLists.txt: its tests compute). At -O2 -g this
# build alone took an hour on 2 cores; at -O1 -g1, 31 minutes. File by file
# (DSL_UNITY_BUILD=OFF): every source must compile on its own.
if [ "${DSL_TEST_SANITIZE:-1}" != 0 ]; then
  asan_targets=(base_tests proto_tests launcher_tests agent_tests worker_tests)
  cmake -S . -B build-asan -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O0 -g1 -DNDEBUG" \
    -DDSL_SANITIZE=address,undefined -DDSL_CUDA=OFF -DDSL_UNITY_BUILD=OFF >/dev/null
  # Test discovery runs the binaries at build time: no leak check there.
  ASAN_OPTIONS=detect_leaks=0 cmake --build build-asan -j 2 --target "${asan_targets[@]}"
  phase_done "sanitizer build"
  leaks=1
  if ASAN_OPTIONS=detect_leaks=1 build-asan/bin/proto_tests --gtest_list_tests 2>&1 |
      grep -q "LeakSanitizer has encountered a fatal error"; then
    echo "test.sh: LeakSanitizer cannot run here (it needs ptrace); leak checks off"
    leaks=0
  fi
  ASAN_OPTIONS="halt_on_error=1:detect_leaks=$leaks:detect_stack_use_after_return=1" \
  UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1" \
    ctest --test-dir build-asan --output-on-failure -j 2 -L unit
  phase_done "sanitizer unit tests"
fi

# Fuzzing (tests/fuzz, docs/fuzzing.md): each libFuzzer target for a short
# bounded time over its kept corpus; a crash, leak or timeout fails the run.
# DSL_FUZZ_SECONDS=0 skips it.
if [ "${DSL_FUZZ_SECONDS:-20}" != 0 ]; then
  bash tests/fuzz/run.sh "${DSL_FUZZ_SECONDS:-20}"
  phase_done "fuzzing"
fi
