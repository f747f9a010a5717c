#!/usr/bin/env bash
# Launch and tear-down latency under SLURM: dslaunch (--launcher slurm, one
# srun step of agents; and --launcher openmpi, mpirun starting them) against
# srun itself and OpenMPI's mpirun (which starts its daemons through srun)
# starting the same rank program, in the same
# allocation, on a real SLURM cluster built on this machine
# (tests/cluster/cluster.sh with CLUSTER_SLURM=1: slurmctld, a slurmd per
# node namespace).
#
# usage: bench/launch_slurm.sh [--runs N] [--nodes "3 8"] [--quick]
#   --runs N     measured runs per tool and size (default 10; one warm-up
#                run each is discarded; the tools take turns)
#   --nodes LIST node counts (default "3 8"), 2 ranks per node (SLOTS)
# env: DSLAUNCH_BUILD (default <repo>/build), BENCH_SETTLE_MS (20),
#      BENCH_RUN_TIMEOUT_S (30), BENCH_CAP_S (3: a tool still running that
#      long after the failing rank's exit is stopped and counted as never)
#
# One run measures, as bench/launch_local.sh does (bench/benchhelper.c):
#   launch   = latest rank start - instant before the tool is forked
#   teardown = tool returned - the failing rank's exit(1) (the last rank
#              exits 1 once every rank started; the others sleep 60 s)
# srun runs with --kill-on-bad-exit=1 (so it ends the step at the first
# failure, as dslaunch does) and --overlap (as dslaunch's agent step: a step
# still completing does not hold the next one back); mpirun with its
# defaults but for that.
# Needs root. Targets (issue 10): dslaunch's launch <= 1.2 x srun's, its
# tear-down < 100 ms after the failure.
set -euo pipefail

SCRIPT_DIR=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=bench/lib.sh
. "$SCRIPT_DIR/lib.sh"

usage() { sed -n '2,25p' "$0" | sed 's/^# \{0,1\}//'; }

RUNS=10
NODES_LIST="3 8"
INNER=0
while (($#)); do
  case "$1" in
    --runs) need_positive_int --runs "${2-}"; RUNS=$2; shift 2 ;;
    --runs=*) RUNS=${1#--runs=}; need_positive_int --runs "$RUNS"; shift ;;
    --quick) RUNS=3; shift ;;
    --nodes) [[ $# -ge 2 ]] || { echo "--nodes needs a list, e.g. \"3 8\"" >&2; exit 2; }
             NODES_LIST=$2; shift 2 ;;
    --inner) INNER=1; shift ;;   # (internal) the runs, inside the allocation
    -h|--help) usage; exit 0 ;;
    *) echo "unknown argument: $1" >&2; usage >&2; exit 2 ;;
  esac
done

SLOTS=${SLOTS:-2}
SETTLE_MS=${BENCH_SETTLE_MS:-20}
RUN_TIMEOUT_MS=$(( ${BENCH_RUN_TIMEOUT_S:-30} * 1000 ))
CAP_MS=$(( ${BENCH_CAP_S:-3} * 1000 ))
TOOLS=(dslaunch dslaunch-openmpi srun mpirun)

# ------------------------------------------------------ inside the allocation ---
# Called as `salloc ... launch_slurm.sh --inner` with BENCH_WORK,
# BENCH_HELPER, BENCH_TAG and BENCH_DSLAUNCH from the outer run (prefixed:
# cluster.sh, which passes them on, has variables of its own named TAG...);
# appends "tool launch_ns teardown_ns" or "tool CAPPED launch_ns" lines to
# $WORK/results.
if ((INNER)); then
  WORK=$BENCH_WORK HELPER=$BENCH_HELPER TAG=$BENCH_TAG DSLAUNCH=$BENCH_DSLAUNCH
  world=$((SLURM_JOB_NUM_NODES * SLOTS))
  one_run() {
    local tool=$1 dir=$WORK/run cap=0
    rm -rf "$dir"; mkdir -p "$dir"
    case $tool in
      dslaunch) CMD=("$DSLAUNCH" --no_local_rank "$HELPER" rank "$dir" "$SETTLE_MS" ds) ;;
      # the same ranks, with mpirun starting one agent process per rank
      dslaunch-openmpi) CMD=("$DSLAUNCH" --launcher openmpi --no_local_rank
                             "$HELPER" rank "$dir" "$SETTLE_MS" ds) ;;
      srun) CMD=(srun --ntasks-per-node="$SLOTS" --kill-on-bad-exit=1 --overlap
                 "$HELPER" rank "$dir" "$SETTLE_MS" slurm) ;;
      # its daemons' srun step overlaps too (plm_slurm_args)
      mpirun) CMD=(env OMPI_MCA_plm_slurm_args=--overlap
                   mpirun --allow-run-as-root -np "$world" --map-by "ppr:$SLOTS:node"
                   "$HELPER" rank "$dir" "$SETTLE_MS" mpi)
              cap=$CAP_MS ;;
    esac
    timed_run "$dir" "$world" "$cap" "$WORK/last.$tool.log" "${CMD[@]}"
    "$HELPER" reap "$TAG" KILL >/dev/null || true
    RESULT=""
    case "$LINE" in
      # srun exits with what ended its tasks (143: the ones it killed)
      OK*) ok_result "$tool ${SLURM_JOB_NUM_NODES}x$SLOTS" "$LINE" \
             "$([[ $tool == srun ]] && echo nonzero || echo 1)" ;;
      CAPPED*) RESULT=$LINE ;;
      *) run_failed "$tool ${SLURM_JOB_NUM_NODES}x$SLOTS" "$LINE" "$WORK/last.$tool.log" ;;
    esac
    rm -rf "$dir"
  }
  for tool in "${TOOLS[@]}"; do one_run "$tool"; done  # warm-up, discarded
  for ((r = 1; r <= RUNS; r++)); do
    for tool in "${TOOLS[@]}"; do
      one_run "$tool"
      case "$RESULT" in
        OK*) read -r _ l t <<<"$RESULT"; echo "$tool $l $t" >>"$WORK/results" ;;
        CAPPED*) read -r _ l _ <<<"$RESULT"; echo "$tool CAPPED $l" >>"$WORK/results" ;;
      esac
    done
  done
  exit_on_errors
  exit 0
fi

# ------------------------------------------------------------------ outside ---
read -r -a NODE_COUNTS <<<"$NODES_LIST"
((${#NODE_COUNTS[@]})) || { echo "--nodes: empty list" >&2; exit 2; }
for n in "${NODE_COUNTS[@]}"; do
  if ! [[ $n =~ ^[1-9][0-9]*$ ]] || ((n > 252)); then
    echo "--nodes: '$n' is not a node count 1..252" >&2; exit 2
  fi
done
REPO=$(cd "$SCRIPT_DIR/.." && pwd)
CLUSTER_SH=$REPO/tests/cluster/cluster.sh
BUILD=${DSLAUNCH_BUILD:-$REPO/build}
need_build_bins "$BUILD"
[[ $(id -u) -eq 0 ]] || { echo "needs root (tests/cluster/cluster.sh builds the cluster)" >&2; exit 77; }
for t in srun salloc mpirun; do
  command -v "$t" >/dev/null || { echo "$t not found (apt-get install slurm-wlm munge openmpi-bin)" >&2; exit 2; }
done
need_cc

CLUSTER_DIR=""
bench_cleanup_more() {
  if [[ -n "$CLUSTER_DIR" ]]; then
    "$CLUSTER_SH" down "$CLUSTER_DIR" >/dev/null || echo "warning: cluster.sh down $CLUSTER_DIR failed" >&2
  fi
}
bench_init launch_slurm
# A rebuild while the bench runs must not mix versions.
mkdir -p "$WORK/bin"
cp "$BUILD/bin/dslaunch" "$BUILD/bin/dsagent" "$WORK/bin/"
DSLAUNCH=$WORK/bin/dslaunch
build_helper

echo "# dslaunch SLURM launch benchmark, $(date -u '+%Y-%m-%d %H:%M UTC')"
machine_line
echo "commit:   $(git -C "$REPO" rev-parse --short HEAD 2>/dev/null || echo unknown), $("$DSLAUNCH" --version | head -n1)"
echo "SLURM:    slurm-wlm $(dpkg-query -W -f='${Version}' slurm-client 2>/dev/null || echo '?'), $(mpirun --version 2>&1 | head -n1)"
echo "load average at start: $(cut -d' ' -f1-3 /proc/loadavg)"
echo "runs per cell: $RUNS (median), ranks per node: $SLOTS, settle: ${SETTLE_MS} ms, cap: $((CAP_MS / 1000)) s"
echo
printf '| nodes | ranks | tool | launch ms (median) | launch range | tear-down ms (median) | tear-down range |\n'
printf '|------:|------:|------|------:|------:|------:|------:|\n'
declare -A MED
for nodes in "${NODE_COUNTS[@]}"; do
  CLUSTER_DIR=$WORK/c$nodes
  if ! CLUSTER_SLURM=1 CLUSTER_SSHD=0 "$CLUSTER_SH" up "$nodes" "$CLUSTER_DIR" >"$WORK/up.log" 2>&1; then
    cat "$WORK/up.log" >&2
    CLUSTER_DIR=""
    echo "cluster.sh up $nodes failed" >&2
    exit 1
  fi
  : >"$WORK/results"
  env BENCH_WORK="$WORK" BENCH_HELPER="$HELPER" BENCH_TAG="$TAG" BENCH_DSLAUNCH="$DSLAUNCH" \
    BENCH_SETTLE_MS="$SETTLE_MS" BENCH_RUN_TIMEOUT_S=$((RUN_TIMEOUT_MS / 1000)) \
    BENCH_CAP_S=$((CAP_MS / 1000)) \
    "$CLUSTER_SH" login "$CLUSTER_DIR" salloc --quiet -N "$nodes" --ntasks-per-node="$SLOTS" \
    bash "$SCRIPT_DIR/launch_slurm.sh" --inner --runs "$RUNS" || error "$nodes nodes: the runs failed"
  "$CLUSTER_SH" down "$CLUSTER_DIR" >/dev/null
  CLUSTER_DIR=""
  for tool in "${TOOLS[@]}"; do
    launch=$(awk -v t="$tool" '$1 == t {print ($2 == "CAPPED") ? $3 : $2}' "$WORK/results")
    teardown=$(awk -v t="$tool" '$1 == t && $2 != "CAPPED" {print $3}' "$WORK/results")
    capped=$(awk -v t="$tool" '$1 == t && $2 == "CAPPED"' "$WORK/results" | wc -l)
    MED[$tool.$nodes]=$(median_ms <<<"$launch")
    td=$(median_ms <<<"$teardown")
    if ((capped > 0)); then td="$td (never in $capped runs)"; fi
    printf '| %d | %d | %s | %s | %s | %s | %s |\n' "$nodes" $((nodes * SLOTS)) "$tool" \
      "${MED[$tool.$nodes]}" "$(range_ms <<<"$launch")" "$td" "$(range_ms <<<"$teardown")"
  done
done
echo
for nodes in "${NODE_COUNTS[@]}"; do
  awk -v n="$nodes" -v d="${MED[dslaunch.$nodes]}" -v s="${MED[srun.$nodes]}" \
    'BEGIN { if (s > 0) printf "%s nodes: dslaunch launch = %.2f x srun'"'"'s (target <= 1.2)\n", n, d / s }'
done
echo "launch = last rank started - tool invoked; tear-down = failing rank's exit(1) - tool returned."
exit_on_errors
