#!/usr/bin/env bash
# Training throughput on the CPU: `dsworker train` (one rank, fp32, ZeRO
# stage 0) against the same GPT-2 in PyTorch (bench/torch_gpt2.py), same
# shapes, batch, optimizer (AdamW, weight decay 0.1, clipping 1.0) and thread
# count, on the same random token shard read in order (no shuffle).
#
# usage: bench/train_cpu.sh [--threads N] [--steps N] [--warmup N]
#                           [--coretype auto|none|NAME] [--quick] [CASE...]
#   CASE         name:layers:heads:channels:batch:seq, e.g. d4:4:4:256:4:1024
#                (default: d4 B4 T1024, d6 B4 T1024, d12 = GPT-2 124M B1 T1024)
#   --threads N  OMP_NUM_THREADS for dsworker, torch.set_num_threads (2)
#   --steps N    steps per run, warm-up included (10; 6 for d12)
#   --warmup N   first steps left out of the median (2)
#   --coretype   OPENBLAS_CORETYPE for both sides. auto (default): only when
#                OpenBLAS fell back to its SSE3 "Prescott" kernels on a CPU
#                it does not know (0.3.21 on Xeon Emerald Rapids): SkylakeX
#                with AVX-512, Haswell with AVX2. none: as installed.
#   --quick      d4 and d6 only, 5 steps
# env: DSLAUNCH_BUILD  build directory with bin/dsworker (default ../build)
#      PYTHON          interpreter with torch (default /usr/bin/python3,
#                      Debian's PyTorch, not whatever python3 is first on PATH)
#
# Reported: median tokens/s over the steps after the warm-up. dsworker's rate
# is its own per-step "tok/s" (steps_per_print 1: the time of one whole
# optimizer step); torch's is timed around zero_grad, forward, backward,
# clip_grad_norm_ and AdamW.step.
set -euo pipefail

usage() { sed -n '2,25p' "$0" | sed 's/^# \{0,1\}//'; }
# shellcheck source=bench/lib.sh
. "$(dirname "$0")/lib.sh"

THREADS=2
STEPS=
WARMUP=2
CASES=()
QUICK=0
CORETYPE=auto
while (($#)); do
  case "$1" in
    --threads) need_count "$1" "${2:-}"; THREADS=$2; shift 2 ;;
    --steps) need_count "$1" "${2:-}"; STEPS=$2; shift 2 ;;
    --warmup) need_count "$1" "${2:-}"; WARMUP=$2; shift 2 ;;
    --coretype) [[ -n "${2:-}" ]] || { echo "--coretype needs a value" >&2; exit 2; }
                CORETYPE=$2; shift 2 ;;
    --quick) QUICK=1; shift ;;
    -h|--help) usage; exit 0 ;;
    *:*:*:*:*:*) CASES+=("$1"); shift ;;
    *) echo "unknown argument: $1" >&2; usage >&2; exit 2 ;;
  esac
done
if ((${#CASES[@]} == 0)); then
  CASES=(d4:4:4:256:4:1024 d6:6:6:384:4:1024)
  ((QUICK)) || CASES+=(d12:12:12:768:1:1024)
fi
((QUICK)) && STEPS=${STEPS:-5}
((THREADS >= 1)) || { echo "--threads must be >= 1" >&2; exit 2; }

ROOT=$(cd "$(dirname "$0")/.." && pwd)
BUILD=${DSLAUNCH_BUILD:-$ROOT/build}
DSWORKER=$BUILD/bin/dsworker
PYTHON=${PYTHON:-/usr/bin/python3}
[[ -x "$DSWORKER" ]] || { echo "no $DSWORKER: build it first" >&2; exit 1; }
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
cp "$DSWORKER" "$TMP/dsworker"  # a rebuild during the run cannot swap it

# Random GPT-2 tokens in an llm.c shard: header int32[256] = {20240520, 1, n}.
"$PYTHON" - "$TMP/tokens.bin" <<'EOF'
import random, struct, sys
n = 1 << 20
rng = random.Random(1337)
with open(sys.argv[1], "wb") as f:
    f.write(struct.pack("<256i", 20240520, 1, n, *([0] * 253)))
    f.write(struct.pack("<%dH" % n, *(rng.randrange(50257) for _ in range(n))))
EOF


# The kernels OpenBLAS picks (it reads OPENBLAS_CORETYPE when it loads).
blas_core() { "$PYTHON" -c 'import ctypes
l = ctypes.CDLL("libopenblas.so.0"); l.openblas_get_corename.restype = ctypes.c_char_p
print(l.openblas_get_corename().decode())'; }
unset OPENBLAS_CORETYPE
DETECTED=$(blas_core)
case "$CORETYPE" in
  none) ;;
  auto) if [[ "$DETECTED" == Prescott ]]; then
          if grep -qw avx512f /proc/cpuinfo; then export OPENBLAS_CORETYPE=SkylakeX
          elif grep -qw avx2 /proc/cpuinfo && grep -qw fma /proc/cpuinfo; then
            export OPENBLAS_CORETYPE=Haswell
          fi
        fi ;;
  *) export OPENBLAS_CORETYPE=$CORETYPE ;;
esac
CORE=$(blas_core)

COMMIT=$(git -C "$ROOT" describe --always --dirty 2>/dev/null || echo unknown)
CPU=$(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -1)
MODEL=$(sed -n 's/^model[[:space:]]*: //p' /proc/cpuinfo | head -1)
TORCH=$("$PYTHON" -c 'import torch; print(torch.__version__)')
TORCH_BLAS=$("$PYTHON" -c 'import torch; c = torch.__config__.show()
print(", ".join(k for k in ("OpenBLAS", "MKL-DNN", "BLAS_INFO=generic", "BLAS_INFO=mkl")
                if k in c) or "unknown")')
echo "# $(date -u +%Y-%m-%dT%H:%MZ), commit $COMMIT, $(nproc) CPUs ($CPU, model $MODEL), $(uname -sr)"
echo "# $("$TMP/dsworker" version); torch $TORCH ($TORCH_BLAS; its GEMMs go to $(readlink -f /usr/lib/x86_64-linux-gnu/libblas.so.3))"
echo "# OpenBLAS $(dpkg-query -W -f='${Version}' libopenblas0-pthread 2>/dev/null || echo '?'): detected core $DETECTED; both sides run with ${OPENBLAS_CORETYPE:+OPENBLAS_CORETYPE=$OPENBLAS_CORETYPE, }core $CORE"
echo "# threads $THREADS; median tokens/s over the steps after $WARMUP warm-up steps"
echo "# load average at start: $(cut -d' ' -f1-3 /proc/loadavg)"
echo
echo "| model | params | B x T | steps | dsworker tok/s | torch tok/s | dsworker / torch |"
echo "|-------|-------:|------:|------:|---------------:|------------:|-----------------:|"

for spec in "${CASES[@]}"; do
  IFS=: read -r name L NH C B T <<<"$spec"
  steps=${STEPS:-$([[ $name == d12 ]] && echo 6 || echo 10)}
  ((steps > WARMUP)) || { echo "--steps must exceed --warmup" >&2; exit 2; }
  cat >"$TMP/$name.json" <<EOF
{
  "train_batch_size": $B,
  "train_micro_batch_size_per_gpu": $B,
  "gradient_clipping": 1.0,
  "steps_per_print": 1,
  "optimizer": {"type": "AdamW",
                "params": {"lr": 1e-4, "betas": [0.9, 0.95], "eps": 1e-8,
                           "weight_decay": 0.1}},
  "zero_optimization": {"stage": 0},
  "model": {"n_layer": $L, "n_head": $NH, "n_embd": $C, "seq_len": $T,
            "vocab_size": 50257},
  "data": {"train": "$TMP/tokens.bin", "shuffle": false},
  "train": {"steps": $steps, "seed": 1337}
}
EOF
  env -u WORLD_SIZE -u RANK -u DSLAUNCH_PROGRESS OMP_NUM_THREADS="$THREADS" \
    "$TMP/dsworker" train --config "$TMP/$name.json" >"$TMP/$name.ours" 2>&1 ||
    { cat "$TMP/$name.ours" >&2; exit 1; }
  ours=$(awk -v w="$WARMUP" '$1 == "step" && $NF == "tok/s" && $2 > w {print $(NF-1)}' \
    "$TMP/$name.ours" | median)
  [[ $ours != n/a ]] || { echo "dsworker printed no step lines" >&2; cat "$TMP/$name.ours" >&2; exit 1; }
  OMP_NUM_THREADS="$THREADS" "$PYTHON" "$ROOT/bench/torch_gpt2.py" \
    --layers "$L" --heads "$NH" --channels "$C" --batch "$B" --seq "$T" \
    --steps "$steps" --warmup "$WARMUP" --threads "$THREADS" \
    --data "$TMP/tokens.bin" >"$TMP/$name.torch" 2>&1 ||
    { cat "$TMP/$name.torch" >&2; exit 1; }
  theirs=$(awk '$1 == "median_tok_s" {print $2}' "$TMP/$name.torch")
  params=$(awk -v L="$L" -v C="$C" -v T="$T" 'BEGIN {
    printf "%.1fM", (50257 * C + T * C + L * (12 * C * C + 13 * C) + 2 * C) / 1e6}')
  awk -v n="$name" -v p="$params" -v bt="$B x $T" -v s="$steps" -v o="$ours" -v t="$theirs" \
    'BEGIN {printf "| %s | %s | %s | %d | %.0f | %.0f | %.2fx |\n", n, p, bt, s, o, t, o / t}'
done
echo
echo "# load average at end: $(cut -d' ' -f1-3 /proc/loadavg)"
