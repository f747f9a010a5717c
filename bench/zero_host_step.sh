#!/usr/bin/env bash
# The host's share of one ZeRO stage 2 step with the optimizer offloaded to
# the CPU, at one rank, as the GPU engine drives it (GPT-2 124M by default):
# ZeroGrad, the backward hooks that reduce each bucket, FinishGradients and
# Update, each phase's median, fastest and slowest of the timed steps. No GPU
# needed: the device's gradient copies are stood in for by an untimed memcpy.
#
# usage: bench/zero_host_step.sh [--threads N] [ARG...]
#   --threads N  OMP_NUM_THREADS (default: OpenMP's, one per CPU)
#   ARG...       passed to the program: --steps N (5), --warmup N (1),
#                --micro N (micro-batches, 1), --layers N (12),
#                --channels N (768), --stage 2|3, --no_clip 1 (clip scale 1
#                instead of 0.5)
# env: DSLAUNCH_BUILD  the CMake build directory (default build); the
#                      program is its target zero_host_step_bench, built here
#
# Memory-bound passes over 0.5 GB buffers: run it on a quiet machine, and
# compare two builds on the same one.
set -euo pipefail

usage() { sed -n '2,18p' "$0" | sed 's/^# \{0,1\}//'; }
# shellcheck source=bench/lib.sh
. "$(dirname "$0")/lib.sh"

ROOT=$(cd "$(dirname "$0")/.." && pwd)
BUILD=${DSLAUNCH_BUILD:-$ROOT/build}
ARGS=()
while (($#)); do
  case "$1" in
    --threads) need_positive_int "$1" "${2:-}"; export OMP_NUM_THREADS=$2; shift 2 ;;
    -h|--help) usage; exit 0 ;;
    *) ARGS+=("$1"); shift ;;
  esac
done

cmake --build "$BUILD" --target zero_host_step_bench >/dev/null
COMMIT=$(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo unknown)
CPU=$(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -1)
echo "# $(date -u +%Y-%m-%dT%H:%MZ), commit $COMMIT, $(nproc) CPUs ($CPU), $(uname -sr)"
echo "# load average at start: $(cut -d' ' -f1-3 /proc/loadavg)"
"$BUILD/bin/zero_host_step_bench" "${ARGS[@]}"
echo "# load average at end: $(cut -d' ' -f1-3 /proc/loadavg)"
