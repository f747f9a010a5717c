#!/usr/bin/env bash
# What the console costs (issue 12): rank output relayed per second and the
# launch-to-exit time of a short job, for this build against a baseline build
# of dslaunch from before the live table, folding and the watch timer
# (commit 850a008), in the same run. Without BASELINE_BUILD only this build
# is measured.
#
# usage: bench/console.sh [--runs N] [--lines L]
#   --runs N    runs per row (default 5; the median is shown)
#   --lines L   lines each rank writes in the relay rows (default 200000)
# env: DSLAUNCH_BUILD  this build (default <script dir>/../build)
#      BASELINE_BUILD  the baseline's build directory (bin/dslaunch, bin/dsagent)
#
# relay: 2 nodes (127.0.0.1-2) x 2 ranks, each writing L lines of 100 bytes
#   as fast as it can (bench/benchhelper.c spew); lines/s = 4 L / wall time of
#   the whole job, its stdout to a file. "lost" is the median number of lines
#   that did not reach the output (the console drops, and says so, what a
#   terminal does not take in time; into a file nothing may be lost, which is
#   an ERROR). "same" rows, where all ranks write one text, count the ranks in
#   the folded prefixes. "pty" rows run dslaunch under script(1), a real
#   terminal: there this build draws its live table.
# launch: 3 nodes x 2 ranks of /bin/true: fork to exit, milliseconds.
set -euo pipefail

SCRIPT_DIR=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=bench/lib.sh
. "$SCRIPT_DIR/lib.sh"

usage() { sed -n '2,20p' "$0" | sed 's/^# \{0,1\}//'; }

RUNS=5
LINES=200000
while (($#)); do
  case "$1" in
    --runs) need_positive_int --runs "${2-}"; RUNS=$2; shift 2 ;;
    --lines) need_positive_int --lines "${2-}"; LINES=$2; shift 2 ;;
    -h|--help) usage; exit 0 ;;
    *) echo "unknown argument: $1" >&2; usage >&2; exit 2 ;;
  esac
done

CURRENT=${DSLAUNCH_BUILD:-$SCRIPT_DIR/../build}
BASELINE=${BASELINE_BUILD:-}
need_cc
command -v script >/dev/null || { echo "script(1) (util-linux) is needed" >&2; exit 2; }
bench_init dsl-console-bench
build_helper
ERRORS=0

hostfile() {  # hostfile NODES SLOTS -> path
  local f=$WORK/hosts.$1x$2
  : >"$f"
  for ((n = 1; n <= $1; n++)); do echo "127.0.0.$n slots=$2" >>"$f"; done
  echo "$f"
}

now_ns() { date +%s%N; }

# relay_once BUILD PTY TEXT EXTRA...: prints lines/s of one run
relay_once() {
  local build=$1 pty=$2 text=$3
  shift 3
  local cmd=("$build/bin/dslaunch" --hostfile "$(hostfile 2 2)" --launcher local
    --no_local_rank "$@" "$HELPER" spew "$LINES" 100 "$text")
  local out=$WORK/out start end got
  start=$(now_ns)
  if [[ $pty == pty ]]; then
    local quoted
    quoted=$(printf '%q ' env "$TAG" LANG=C.UTF-8 TERM=xterm "${cmd[@]}")
    script -qefc "$quoted" /dev/null >"$out" 2>&1 </dev/null || error "relay run failed"
  else
    env "$TAG" "${cmd[@]}" >"$out" 2>"$WORK/err" </dev/null || error "relay run failed"
  fi
  end=$(now_ns)
  if [[ $text == distinct ]]; then
    got=$(grep -c "line .* xxxx" "$out" || true)
  else  # ranks covered by the (folded) prefixes of the same text
    got=$(grep "the same line on every rank" "$out" | sed 's/\] .*//; s/^\[//' |
      tr ',' '\n' | awk -F: '{split($NF, r, "-"); n += (r[2] == "" ? 1 : r[2] - r[1] + 1)} END {print n + 0}')
  fi
  if ((got != 4 * LINES)) && [[ $pty != pty ]]; then
    error "relay: $got of $((4 * LINES)) lines arrived ($build $pty $text $*)"
  fi
  awk -v l=$((4 * LINES)) -v got="$got" -v ns=$((end - start)) \
    'BEGIN {printf "%.0f %d\n", l / (ns / 1e9), l - got}'
}

relay_row() {  # relay_row LABEL BUILD PTY TEXT EXTRA...
  local label=$1
  shift
  local runs
  runs=$(for ((i = 0; i < RUNS; i++)); do relay_once "$@"; done)
  printf "%-44s %14s %8s\n" "$label" "$(cut -d' ' -f1 <<<"$runs" | median)" \
    "$(cut -d' ' -f2 <<<"$runs" | median)"
}

launch_once() {  # launch_once BUILD PTY EXTRA...: ms from fork to exit
  local build=$1 pty=$2
  shift 2
  local cmd=("$build/bin/dslaunch" --hostfile "$(hostfile 3 2)" --launcher local
    --no_local_rank "$@" /bin/true)
  local start end
  start=$(now_ns)
  if [[ $pty == pty ]]; then
    script -qefc "$(printf '%q ' env "$TAG" TERM=xterm "${cmd[@]}")" /dev/null >/dev/null 2>&1 </dev/null ||
      error "launch run failed"
  else
    env "$TAG" "${cmd[@]}" >/dev/null 2>&1 </dev/null || error "launch run failed"
  fi
  end=$(now_ns)
  echo $((end - start))
}

launch_row() {  # launch_row LABEL BUILD PTY EXTRA...
  local label=$1
  shift
  local v
  v=$(for ((i = 0; i < RUNS * 2; i++)); do launch_once "$@"; done | median_ms)
  printf "%-44s %14s\n" "$label" "$v"
}

machine_line
echo "runs per row: $RUNS (median); relay: 2 nodes x 2 ranks, $LINES lines of 100 bytes each"
echo
printf "%-44s %14s %8s\n" "relay (stdout to a file)" "lines/s" "lost"
if [[ -n $BASELINE ]]; then
  relay_row "baseline 850a008" "$BASELINE" file distinct
fi
relay_row "this build, --console lines (folding on)" "$CURRENT" file distinct --console lines
relay_row "this build, --no_fold" "$CURRENT" file distinct --console lines --no_fold
relay_row "this build, identical lines, folded" "$CURRENT" file same --console lines
if [[ -n $BASELINE ]]; then
  relay_row "baseline 850a008, on a pty" "$BASELINE" pty distinct
fi
relay_row "this build, on a pty (live table)" "$CURRENT" pty distinct
echo
printf "%-44s %14s\n" "launch to exit, 3x2 ranks of /bin/true" "ms"
if [[ -n $BASELINE ]]; then
  launch_row "baseline 850a008" "$BASELINE" file
fi
launch_row "this build, --console lines" "$CURRENT" file --console lines
if [[ -n $BASELINE ]]; then
  launch_row "baseline 850a008, on a pty" "$BASELINE" pty
fi
launch_row "this build, on a pty (live table)" "$CURRENT" pty
exit_on_errors
