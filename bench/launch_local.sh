#!/usr/bin/env bash
# Launch and tear-down latency of dslaunch (--launcher local) against plain
# OpenMPI mpirun, for job shapes 1x1, 3x2 and 8x4 (nodes x ranks per node),
# all on this one machine.
#
# usage: bench/launch_local.sh [--runs N] [--quick]
#   --runs N   measured runs per launcher and shape (default 20)
#   --quick    5 runs
# env: DSLAUNCH_BUILD  build directory holding bin/dslaunch and bin/dsagent
#                      (default: <script dir>/../build)
#      BENCH_SETTLE_MS pause of the failing rank after all ranks started (20)
#      BENCH_RUN_TIMEOUT_S  a run that takes longer is killed and counted as
#                      failed (30)
#      BENCH_MPIRUN_ARGS extra mpirun arguments, split on blanks (default none:
#                      plain mpirun), e.g. "--mca odls_base_sigkill_timeout 0"
#
# One run measures both numbers:
#   launch    = (latest rank start) - (instant just before the launcher is
#               fork()ed). Each rank is a tiny C program (bench/benchhelper.c)
#               that, first thing in main(), writes clock_gettime(CLOCK_REALTIME)
#               and its pid to DIR/start.<rank>.
#   teardown  = (launcher's waitpid() returned) - (instant the failing rank
#               calls _exit(1)). The last rank (rank = world size - 1) waits
#               until every rank has written its start file, sleeps
#               BENCH_SETTLE_MS, records the time and exits 1; all other ranks
#               sleep 60 s and must be killed by the launcher.
#   Right after the launcher returns, every rank pid is checked (kill -0 and
#   /proc/<pid>/stat not a zombie): a live rank is a leftover and an ERROR.
#   Then any remaining process of the run (found by a marker in its
#   environment: agents, orted, ranks) is reported and killed.
#
# dslaunch gets a hostfile with 127.0.0.1 .. 127.0.0.<nodes>, slots=<ranks per
# node>: every alias is a separate node with its own dsagent. mpirun has no
# such notion: it gets -np <total ranks> --oversubscribe on the one host, which
# is the fair single-machine comparison.
set -euo pipefail

SCRIPT_DIR=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=bench/lib.sh
. "$SCRIPT_DIR/lib.sh"

usage() { sed -n '2,15p' "$0" | sed 's/^# \{0,1\}//'; }

RUNS=20
while (($#)); do
  case "$1" in
    --runs) need_positive_int --runs "${2-}"; RUNS=$2; shift 2 ;;
    --runs=*) RUNS=${1#--runs=}; need_positive_int --runs "$RUNS"; shift ;;
    --quick) RUNS=5; shift ;;
    -h|--help) usage; exit 0 ;;
    *) echo "unknown argument: $1" >&2; usage >&2; exit 2 ;;
  esac
done

SHAPES=("1x1" "3x2" "8x4")
SETTLE_MS=${BENCH_SETTLE_MS:-20}
RUN_TIMEOUT_MS=$(( ${BENCH_RUN_TIMEOUT_S:-30} * 1000 ))

BUILD=${DSLAUNCH_BUILD:-$SCRIPT_DIR/../build}
DSLAUNCH=$BUILD/bin/dslaunch
need_build_bins "$BUILD"
MPIRUN=$(command -v mpirun || true)
[[ -n "$MPIRUN" ]] || { echo "mpirun not found (apt-get install openmpi-bin)" >&2; exit 2; }
need_cc

bench_init launch_local
build_helper

# ------------------------------------------------------------- launchers ---
MPI_FLAGS=()
if [[ $(id -u) -eq 0 ]]; then MPI_FLAGS=(--allow-run-as-root); fi
read -r -a MPI_EXTRA <<<"${BENCH_MPIRUN_ARGS:-}"
MPI_FLAGS+=("${MPI_EXTRA[@]}")

# cmd_for LAUNCHER NODES PER_NODE DIR -> fills CMD array
cmd_for() {
  local launcher=$1 nodes=$2 per=$3 dir=$4
  if [[ $launcher == dslaunch ]]; then
    local hf=$WORK/hostfile.${nodes}x${per} i
    if [[ ! -f $hf ]]; then
      for ((i = 1; i <= nodes; i++)); do echo "127.0.0.$i slots=$per"; done >"$hf"
    fi
    CMD=("$DSLAUNCH" --hostfile "$hf" --launcher local --no_local_rank
         "$HELPER" rank "$dir" "$SETTLE_MS" ds)
  else
    CMD=("$MPIRUN" "${MPI_FLAGS[@]}" --oversubscribe -np $((nodes * per))
         "$HELPER" rank "$dir" "$SETTLE_MS" mpi)
  fi
}

# one_run LAUNCHER NODES PER_NODE -> sets RESULT ("OK launch_ns teardown_ns") or ""
one_run() {
  local launcher=$1 nodes=$2 per=$3
  local n=$((nodes * per)) dir=$WORK/run left
  local what="$launcher ${nodes}x$per"
  rm -rf "$dir"; mkdir -p "$dir"
  cmd_for "$launcher" "$nodes" "$per" "$dir"
  timed_run "$dir" "$n" 0 "$WORK/last.$launcher.log" "${CMD[@]}"
  # anything of this run still alive (agents, orted, ranks) is killed here
  left=$("$HELPER" reap "$TAG" KILL)
  RESULT=""
  case "$LINE" in
    OK*) ok_result "$what" "$LINE" ;;
    *) run_failed "$what" "$LINE" "$WORK/last.$launcher.log" ;;
  esac
  if [[ $left -ne 0 ]]; then
    error "$what: $left process(es) of the run left behind (killed)"
  fi
  rm -rf "$dir"
}

# ----------------------------------------------------------------- header ---
echo "# dslaunch local launch benchmark, $(date -u '+%Y-%m-%d %H:%M UTC')"
machine_line
echo "dslaunch: $("$DSLAUNCH" --version 2>&1 | head -n1) ($DSLAUNCH)"
echo "mpirun:   $("$MPIRUN" --version 2>&1 | head -n1) ($MPIRUN)${BENCH_MPIRUN_ARGS:+, extra args: $BENCH_MPIRUN_ARGS}"
echo "runs per cell: $RUNS (median), settle before the failing rank exits: ${SETTLE_MS} ms"
echo

declare -A LAUNCH TEARDOWN
for shape in "${SHAPES[@]}"; do
  nodes=${shape%x*}; per=${shape#*x}
  : >"$WORK/ds.launch"; : >"$WORK/ds.teardown"; : >"$WORK/mpi.launch"; : >"$WORK/mpi.teardown"
  # one discarded warm-up run each, then alternate so drift hits both alike
  one_run dslaunch "$nodes" "$per"
  one_run mpirun "$nodes" "$per"
  for ((r = 1; r <= RUNS; r++)); do
    printf '\r%s: run %d/%d ' "$shape" "$r" "$RUNS" >&2
    for launcher in dslaunch mpirun; do
      one_run "$launcher" "$nodes" "$per"
      if [[ -n $RESULT ]]; then
        read -r _ l t <<<"$RESULT"
        p=ds; [[ $launcher == mpirun ]] && p=mpi
        echo "$l" >>"$WORK/$p.launch"
        echo "$t" >>"$WORK/$p.teardown"
      fi
    done
  done
  printf '\r%*s\r' 30 '' >&2
  for p in ds mpi; do
    LAUNCH[$p.$shape]=$(median_ms <"$WORK/$p.launch")
    TEARDOWN[$p.$shape]=$(median_ms <"$WORK/$p.teardown")
  done
done

fmt='| %-5s | %5s | %18s | %16s | %20s | %18s |\n'
# shellcheck disable=SC2059
printf "$fmt" shape ranks "dslaunch launch ms" "mpirun launch ms" "dslaunch teardown ms" "mpirun teardown ms"
printf '|-------|------:|-------------------:|-----------------:|---------------------:|-------------------:|\n'
for shape in "${SHAPES[@]}"; do
  nodes=${shape%x*}; per=${shape#*x}
  # shellcheck disable=SC2059
  printf "$fmt" "$shape" $((nodes * per)) "${LAUNCH[ds.$shape]}" "${LAUNCH[mpi.$shape]}" \
    "${TEARDOWN[ds.$shape]}" "${TEARDOWN[mpi.$shape]}"
done
echo
echo "dslaunch: N nodes = 127.0.0.1..127.0.0.N (one dsagent each), --launcher local."
echo "mpirun:   one host, -np <ranks> --oversubscribe (no notion of the 127.0.0.x nodes)."
echo "launch = last rank started - launcher invoked; teardown = failing rank's exit(1) - launcher returned."
exit_on_errors
