#!/usr/bin/env bash
# Throughput of one CPU AdamW step: worker/cpu_adam's AdamStep (one flat fp32
# buffer per size, every ISA this CPU has) against torch.optim.AdamW of the
# system PyTorch (single-tensor for-loop and foreach implementations), on
# tensors of the same sizes with the same number of threads.
#
# usage: bench/cpu_adam.sh [--threads N] [--steps N] [--warmup N] [--quick] [SIZE...]
#   SIZE...      parameter counts (default 1048576 16777216 124439808, the
#                last being GPT-2 small's)
#   --threads N  OpenMP threads for ours, torch.set_num_threads for torch (2)
#   --steps N    timed steps per case; the median is reported (10)
#   --warmup N   untimed steps first (3)
#   --quick      sizes 1M and 16M, 5 steps
# env: PYTHON  interpreter with torch (default /usr/bin/python3, Debian's
#              PyTorch, not whatever python3 is first on PATH)
#      CXX     compiler for the bench program (default g++)
#
# The bench program (bench/cpu_adam_bench.cc) is compiled here together with
# worker/cpu_adam.cc and proto/status.cc, with the library's flags (-O3
# -march=x86-64-v2 -fopenmp), into a temporary directory.
set -euo pipefail

usage() { sed -n '2,18p' "$0" | sed 's/^# \{0,1\}//'; }
need_int() { [[ "$2" =~ ^[0-9]+$ ]] || { echo "$1 needs a non-negative integer" >&2; exit 2; }; }

THREADS=2
STEPS=10
WARMUP=3
SIZES=()
while (($#)); do
  case "$1" in
    --threads) need_int "$1" "${2:-}"; THREADS=$2; shift 2 ;;
    --steps) need_int "$1" "${2:-}"; STEPS=$2; shift 2 ;;
    --warmup) need_int "$1" "${2:-}"; WARMUP=$2; shift 2 ;;
    --quick) SIZES=(1048576 16777216); STEPS=5; shift ;;
    -h|--help) usage; exit 0 ;;
    [0-9]*) need_int size "$1"; SIZES+=("$1"); shift ;;
    *) echo "unknown argument: $1" >&2; usage >&2; exit 2 ;;
  esac
done
((${#SIZES[@]})) || SIZES=(1048576 16777216 124439808)
((STEPS >= 1 && THREADS >= 1)) || { echo "--steps and --threads must be >= 1" >&2; exit 2; }

ROOT=$(cd "$(dirname "$0")/.." && pwd)
PYTHON=${PYTHON:-/usr/bin/python3}
CXX=${CXX:-g++}
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT

"$CXX" -std=c++20 -O3 -DNDEBUG -march=x86-64-v2 -fopenmp -I"$ROOT" \
  "$ROOT/bench/cpu_adam_bench.cc" "$ROOT/worker/cpu_adam.cc" \
  "$ROOT/proto/status.cc" -o "$TMP/cpu_adam_bench"

export OMP_NUM_THREADS=$THREADS
unset DSL_CPU_ADAM_ISA
"$TMP/cpu_adam_bench" --warmup "$WARMUP" --steps "$STEPS" "${SIZES[@]}" \
  >"$TMP/ours.txt"

COMMIT=$(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo unknown)
CPU=$(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -1)
echo "# $(date -u +%Y-%m-%dT%H:%MZ), commit $COMMIT, $(nproc) CPUs ($CPU), $(uname -sr)"
echo "# threads $THREADS, $WARMUP warm-up + $STEPS timed steps, median"

"$PYTHON" - "$TMP/ours.txt" "$THREADS" "$STEPS" "$WARMUP" "${SIZES[@]}" <<'EOF'
import inspect, statistics, sys, time
import torch

ours_file, threads, steps, warmup = sys.argv[1], *map(int, sys.argv[2:5])
sizes = [int(s) for s in sys.argv[5:]]
torch.set_num_threads(threads)

ours = {}  # (isa, n) -> median ms
isas = []
for line in open(ours_file):
    if line.startswith("#"):
        print(line.strip())
        continue
    _, isa, n, med, lo, hi = line.split()
    ours[(isa, int(n))] = float(med)
    if isa not in isas:
        isas.append(isa)

variants = [("for-loop", dict(foreach=False)), ("foreach", dict(foreach=True))]
if "fused" in inspect.signature(torch.optim.AdamW).parameters:
    variants.append(("fused", dict(fused=True)))
else:
    print(f"# torch {torch.__version__}: AdamW has no fused=True (added in 2.0)")

def torch_ms(n, kwargs):
    p = torch.randn(n)
    p.grad = 1e-2 * torch.randn(n)
    opt = torch.optim.AdamW([p], lr=1e-3, weight_decay=0.01, **kwargs)
    for _ in range(warmup):
        opt.step()
    ms = []
    for _ in range(steps):
        t = time.perf_counter()
        opt.step()
        ms.append((time.perf_counter() - t) * 1e3)
    return statistics.median(ms)

def mps(n, ms):
    return n / ms / 1e3  # Mparam/s

cols = [f"ours {i}" for i in isas] + [f"torch {v}" for v, _ in variants]
print(f"# torch {torch.__version__}, {torch.get_num_threads()} threads; Mparam/s")
print("| params | " + " | ".join(cols) + " | speedup (ours best / torch best) |")
print("|-------:|" + "|".join("-" * (len(c) + 1) + ":" for c in cols) + "|---:|")
for n in sizes:
    ours_rates = [mps(n, ours[(i, n)]) for i in isas]
    torch_rates = [mps(n, torch_ms(n, kw)) for _, kw in variants]
    cells = [f"{r:.0f}" for r in ours_rates + torch_rates]
    speedup = max(ours_rates) / max(torch_rates)
    label = f"{n / 2**20:.1f}M" if n % 2**20 else f"{n // 2**20}M"
    print(f"| {label} ({n}) | " + " | ".join(cells) + f" | {speedup:.1f}x |",
          flush=True)
EOF
