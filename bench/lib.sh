# shellcheck shell=bash
# Shared by the benchmarks in bench/; sourced, not run. Needs bash with set
# -euo pipefail. The training and CPU Adam benchmarks use the argument checks
# and median only.
#
# A launch bench (launch_local.sh, launch_cluster.sh) calls, in this order: need_positive_int while parsing its arguments,
# need_build_bins, need_cc, bench_init NAME (temp dir WORK, marker TAG, traps),
# build_helper; then timed_run, ok_result, run_failed and error per run,
# median_ms / range_ms / median for the tables, and exit_on_errors last.
# A bench that has more to undo on exit redefines bench_cleanup_more.

BENCH_LIB_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ERRORS=0

# need_positive_int OPTION VALUE: exit 2 unless VALUE is a positive integer
need_positive_int() {
  [[ $2 =~ ^[1-9][0-9]*$ ]] || { echo "$1 needs a positive integer" >&2; exit 2; }
}

# need_count OPTION VALUE: exit 2 unless VALUE is a non-negative integer
need_count() {
  [[ $2 =~ ^[0-9]+$ ]] || { echo "$1 needs a non-negative integer" >&2; exit 2; }
}

# need_build_bins BUILD: exit 2 unless BUILD/bin holds dslaunch and dsagent
need_build_bins() {
  local b
  for b in "$1/bin/dslaunch" "$1/bin/dsagent"; do
    [[ -x "$b" ]] || { echo "missing $b (build it or set DSLAUNCH_BUILD)" >&2; exit 2; }
  done
}

# need_cc: sets CC (default cc), exit 2 when there is no such compiler
need_cc() {
  CC=${CC:-cc}
  command -v "$CC" >/dev/null || { echo "no C compiler ($CC)" >&2; exit 2; }
}

# ----------------------------------------------------- temp dir and cleanup ---
# bench_init NAME: WORK (a fresh temp dir), TAG (an environment entry that
# marks every process of this bench), HELPER (where build_helper puts
# benchhelper), CURRENT_PID (the run in flight, stopped on exit); installs
# the traps: on any exit the run in flight is stopped, every tagged process
# is reaped, bench_cleanup_more runs and WORK is removed.
bench_init() {
  WORK=$(mktemp -d "${TMPDIR:-/tmp}/$1.XXXXXX")
  TAG="DSLAUNCH_BENCH_TAG=$$.$RANDOM.$RANDOM"
  HELPER=$WORK/benchhelper
  CURRENT_PID=""
  trap bench_cleanup EXIT
  trap 'echo "interrupted" >&2; exit 130' INT
  trap 'exit 143' TERM
  trap 'exit 129' HUP
}

bench_cleanup_more() { :; }

# The test cluster of a bench over SSH (tests/cluster/cluster.sh; needs
# root). bench_cluster_up N: a cluster of N nodes in WORK (SLOTS, from the
# environment, slots per node), its env loaded and its node addresses in
# NODES; exits with cluster.sh's status when it cannot be built (a failed up
# tears itself down). bench_cluster_down: tears it down (also on exit).
CLUSTER_SH=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)/tests/cluster/cluster.sh
CLUSTER_DIR=""
bench_cluster_up() {
  local n=$1 rc=0
  bench_cluster_down
  CLUSTER_DIR=$WORK/c$n
  SLOTS=${SLOTS:-2} "$CLUSTER_SH" up "$n" "$CLUSTER_DIR" >"$WORK/up.log" 2>&1 || rc=$?
  if ((rc != 0)); then
    cat "$WORK/up.log" >&2
    CLUSTER_DIR=""
    echo "cluster.sh up $n failed (exit $rc)" >&2
    exit "$rc"
  fi
  set -a
  # shellcheck disable=SC1091
  . "$CLUSTER_DIR/env"
  set +a
  read -r -a NODES <<<"$CLUSTER_NODES"
}
bench_cluster_down() {
  if [[ -n "$CLUSTER_DIR" ]]; then
    "$CLUSTER_SH" down "$CLUSTER_DIR" >/dev/null ||
      echo "warning: cluster.sh down $CLUSTER_DIR failed" >&2
    CLUSTER_DIR=""
  fi
}

bench_cleanup() {
  local rc=$?
  trap - EXIT INT TERM HUP
  if [[ -n "$CURRENT_PID" ]]; then
    kill -TERM "$CURRENT_PID" 2>/dev/null || true
    wait "$CURRENT_PID" 2>/dev/null || true
  fi
  if [[ -x "$HELPER" ]]; then   # the pid namespace is shared: this finds ranks on cluster nodes too
    "$HELPER" reap "$TAG" TERM >/dev/null 2>&1 || true
    sleep 0.2
    "$HELPER" reap "$TAG" KILL >/dev/null 2>&1 || true
  fi
  bench_cluster_down
  bench_cleanup_more
  rm -rf "$WORK"
  exit "$rc"
}

# build_helper: compiles bench/benchhelper.c into HELPER
build_helper() {
  "$CC" -O2 -o "$HELPER" "$BENCH_LIB_DIR/benchhelper.c"
}

# ------------------------------------------------------------------- runs ---
# timed_run DIR NRANKS CAP_MS LOG CMD...: `benchhelper run DIR NRANKS
# RUN_TIMEOUT_MS CAP_MS CMD...` with TAG in its environment and its stderr (and
# the launcher's) in LOG, as the run in flight; LINE is its result line (see
# bench/benchhelper.c)
timed_run() {
  local dir=$1 n=$2 cap=$3 log=$4
  shift 4
  env "$TAG" "$HELPER" run "$dir" "$n" "$RUN_TIMEOUT_MS" "$cap" "$@" \
      </dev/null >"$WORK/result" 2>"$log" &
  CURRENT_PID=$!
  wait "$CURRENT_PID" || true
  CURRENT_PID=""
  # shellcheck disable=SC2034  # read by the bench
  LINE=$(cat "$WORK/result")
}

# error MESSAGE...: an ERROR line on stderr, counted in ERRORS
error() {
  echo "ERROR: $*" >&2
  ERRORS=$((ERRORS + 1))
}

# ok_result WHAT LINE [CODE]: LINE is "OK launch_ns teardown_ns exitcode
# leftovers"; the launcher must have exited CODE (default 1; "nonzero": any
# but 0) with no rank alive, else ERROR; sets RESULT="OK launch_ns teardown_ns"
ok_result() {
  local what=$1 want=${3:-1} launch teardown code leftovers
  read -r _ launch teardown code leftovers <<<"$2"
  if [[ $want == nonzero && $code -eq 0 ]] || [[ $want != nonzero && $code -ne $want ]]; then
    error "$what: launcher exited $code, expected $want"
  fi
  if [[ $leftovers -ne 0 ]]; then
    error "$what: $leftovers rank(s) still alive when the launcher returned"
  fi
  # shellcheck disable=SC2034  # read by the bench
  RESULT="OK $launch $teardown"
}

# run_failed WHAT LINE LOG: ERROR with the end of the launcher's output
run_failed() {
  error "$1: run failed: $2; launcher output:"
  tail -n 15 "$3" | sed 's/^/    /' >&2
}

exit_on_errors() {
  if ((ERRORS)); then
    echo "ERRORS: $ERRORS (see messages above)" >&2
    exit 1
  fi
}

# ------------------------------------------------------------- statistics ---
median_ms() {  # stdin: ns values, one a line
  sort -n | awk '{v[NR] = $1} END {
    if (NR == 0) { print "n/a"; exit }
    m = (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2
    printf "%.1f", m / 1e6 }'
}
range_ms() {  # stdin: ns values -> "min-max"
  sort -n | awk '{v[NR] = $1} END {
    if (NR == 0) { print "n/a"; exit }
    printf "%.0f-%.0f", v[1] / 1e6, v[NR] / 1e6 }'
}
median() {  # stdin: numbers, one a line
  sort -g | awk '{v[NR] = $1} END {
    if (NR == 0) { print "n/a"; exit }
    print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'
}

# ----------------------------------------------------------------- header ---
machine_line() {
  echo "machine: $(nproc) CPUs ($(grep -m1 'model name' /proc/cpuinfo 2>/dev/null | cut -d: -f2- | sed 's/^ *//')), kernel $(uname -sr), $(awk '/MemTotal/ {printf "%.0f GiB RAM", $2/1048576}' /proc/meminfo)"
}
