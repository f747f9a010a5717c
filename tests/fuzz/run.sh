#!/usr/bin/env bash
# Builds the libFuzzer targets with clang-14 in build-fuzz/ and runs each for
# a bounded time over its kept corpus (tests/fuzz/corpus/<target>/). Fails on
# any crash, leak, timeout or out-of-memory. Usage:
#   tests/fuzz/run.sh [seconds-per-target] [target...]
# DSL_FUZZ_RUNS=N stops each target after N inputs (or the time limit,
# whichever comes first; 0 seconds = no time limit), as in the long run of
# docs/fuzzing.md; DSL_FUZZ_MAX_LEN=N caps input length below the
# defaults below.
# Targets: hostfile frames progress config horovod_http (default: all). New inputs the
# fuzzer finds go to build-fuzz/fuzz-corpus/<target>/, never into the kept
# corpus; reproducers of failures are written to build-fuzz/fuzz-artifacts/.
set -euo pipefail

root=$(cd "$(dirname "$0")/../.." && pwd)
seconds=${1:-20}
shift || true
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=(hostfile frames progress config horovod_http)
build=${DSL_FUZZ_BUILD:-$root/build-fuzz}
jobs=${DSL_FUZZ_JOBS:-2}

declare -A dict=([hostfile]=hostfile.dict [progress]=json.dict [config]=config.dict
  [horovod_http]=http.dict)
# Progress records may be 64 KiB: longer inputs reach the size limit.
declare -A max_len=([hostfile]=8192 [frames]=8192 [progress]=70000 [config]=8192
  [horovod_http]=8192)

launcher=$(command -v ccache || true)
if [ ! -f "$build/build.ninja" ]; then
  CC=clang-14 CXX=clang++-14 cmake -S "$root" -B "$build" -G Ninja \
    -DCMAKE_BUILD_TYPE=RelWithDebInfo -DDSL_FUZZ=ON -DDSL_CUDA=OFF \
    ${launcher:+-DCMAKE_CXX_COMPILER_LAUNCHER=$launcher} >/dev/null
fi
cmake --build "$build" -j"$jobs" --target "${targets[@]/%/_fuzz}"

status=0
for t in "${targets[@]}"; do
  work="$build/fuzz-corpus/$t"
  artifacts="$build/fuzz-artifacts/$t/"
  mkdir -p "$work" "$artifacts"
  args=(-rss_limit_mb=2048 -timeout=10 -max_len="${DSL_FUZZ_MAX_LEN:-${max_len[$t]}}"
        -print_final_stats=1 -artifact_prefix="$artifacts")
  [ "$seconds" != 0 ] && args+=(-max_total_time="$seconds")
  [ -n "${DSL_FUZZ_RUNS:-}" ] && args+=(-runs="$DSL_FUZZ_RUNS")
  [ -n "${dict[$t]:-}" ] && args+=(-dict="$root/tests/fuzz/${dict[$t]}")
  echo "== $t: ${seconds}s"
  if ! ASAN_OPTIONS=detect_leaks=1:allocator_may_return_null=1 \
      UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
      "$build/bin/${t}_fuzz" "${args[@]}" "$work" "$root/tests/fuzz/corpus/$t" \
      2>"$build/fuzz-$t.log"; then
    echo "FAIL: $t (log: $build/fuzz-$t.log, reproducer in $artifacts)"
    grep -E "^==[0-9]+==ERROR|^SUMMARY|invariant broken|^artifact_prefix|Test unit written" \
      "$build/fuzz-$t.log" | head -20 || true
    status=1
  else
    grep -E "^#[0-9]+.*DONE|^stat::" "$build/fuzz-$t.log" || true
  fi
done
exit $status
