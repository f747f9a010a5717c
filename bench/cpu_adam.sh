#!/usr/bin/env bash
# Throughput of one CPU AdamW step: worker/cpu_adam's AdamStep (one flat fp32
# buffer per size, every ISA this CPU has) against torch.optim.AdamW of the
# system PyTorch (single-tensor for-loop and foreach implementations), on
# tensors of the same sizes with the same number of threads.
#
# usage: bench/cpu_adam.sh [--threads N] [--steps N] [--warmup N] [--rounds N]
#                          [--quick] [SIZE...]
#   SIZE...      parameter counts (default 1048576 16777216 124439808, the
#                last being GPT-2 small's)
#   --threads N  OpenMP threads for ours, torch.set_num_threads for torch (2)
#   --steps N    timed steps per case and round; their median counts (10)
#   --warmup N   untimed steps first (3)
#   --rounds N   rounds per size, ours and torch alternating; the table shows
#                each case's fastest round median, "spread" the slowest over
#                the fastest, for all cases of the row (3)
#   --quick      sizes 1M and 16M, 5 steps, 2 rounds
# env: PYTHON  interpreter with torch (default /usr/bin/python3, Debian's
#              PyTorch, not whatever python3 is first on PATH)
#      CXX     compiler for the bench program (default g++)
#
# The bench program (bench/cpu_adam_bench.cc) is compiled here together with
# worker/cpu_adam.cc and base/status.cc, with the library's flags (-O3
# -march=x86-64-v2 -fopenmp), into a temporary directory. Other processes on
# the CPUs skew both sides, torch's more (about 9 OpenMP regions per step
# against our 1, each waiting for its slowest thread): run it on a quiet
# machine; rounds only soften short bursts.
set -euo pipefail

usage() { sed -n '2,27p' "$0" | sed 's/^# \{0,1\}//'; }
# shellcheck source=bench/lib.sh
. "$(dirname "$0")/lib.sh"

THREADS=2
STEPS=10
WARMUP=3
ROUNDS=3
SIZES=()
while (($#)); do
  case "$1" in
    --threads) need_count "$1" "${2:-}"; THREADS=$2; shift 2 ;;
    --steps) need_count "$1" "${2:-}"; STEPS=$2; shift 2 ;;
    --warmup) need_count "$1" "${2:-}"; WARMUP=$2; shift 2 ;;
    --rounds) need_count "$1" "${2:-}"; ROUNDS=$2; shift 2 ;;
    --quick) SIZES=(1048576 16777216); STEPS=5; ROUNDS=2; shift ;;
    -h|--help) usage; exit 0 ;;
    [0-9]*) need_count size "$1"; SIZES+=("$1"); shift ;;
    *) echo "unknown argument: $1" >&2; usage >&2; exit 2 ;;
  esac
done
((${#SIZES[@]})) || SIZES=(1048576 16777216 124439808)
((STEPS >= 1 && THREADS >= 1 && ROUNDS >= 1)) ||
  { echo "--steps, --threads and --rounds must be >= 1" >&2; exit 2; }

ROOT=$(cd "$(dirname "$0")/.." && pwd)
PYTHON=${PYTHON:-/usr/bin/python3}
CXX=${CXX:-g++}
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT

"$CXX" -std=c++20 -O3 -DNDEBUG -march=x86-64-v2 -fopenmp -I"$ROOT" \
  "$ROOT/bench/cpu_adam_bench.cc" "$ROOT/worker/cpu_adam.cc" \
  "$ROOT/base/status.cc" -o "$TMP/cpu_adam_bench"

export OMP_NUM_THREADS=$THREADS
unset DSL_CPU_ADAM_ISA
COMMIT=$(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo unknown)
CPU=$(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -1)
echo "# $(date -u +%Y-%m-%dT%H:%MZ), commit $COMMIT, $(nproc) CPUs ($CPU), $(uname -sr)"
echo "# threads $THREADS; per case $WARMUP warm-up + $STEPS timed steps, median; fastest of $ROUNDS rounds"
echo "# load average at start: $(cut -d' ' -f1-3 /proc/loadavg)"

"$PYTHON" - "$TMP/cpu_adam_bench" "$THREADS" "$STEPS" "$WARMUP" "$ROUNDS" \
  "${SIZES[@]}" <<'EOF'
import inspect, statistics, subprocess, sys, time
import torch

bench, (threads, steps, warmup, rounds) = sys.argv[1], map(int, sys.argv[2:6])
sizes = [int(s) for s in sys.argv[6:]]
torch.set_num_threads(threads)

variants = [("for-loop", dict(foreach=False)), ("foreach", dict(foreach=True))]
if "fused" in inspect.signature(torch.optim.AdamW).parameters:
    variants.append(("fused", dict(fused=True)))
else:
    print(f"# torch {torch.__version__}: AdamW has no fused=True (added in 2.0)")
print(f"# torch {torch.__version__}, {torch.get_num_threads()} threads")

def ours_ms(n):
    """{isa: median ms} from one run of the bench program."""
    out = subprocess.run([bench, "--warmup", str(warmup), "--steps", str(steps),
                          str(n)], check=True, capture_output=True, text=True)
    return {f[1]: float(f[3]) for f in (l.split() for l in out.stdout.splitlines())
            if f[0] == "ours"}

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

def measure(n):
    """{case: [median ms per round]}, ours and torch alternating per round."""
    runs = {}
    for _ in range(rounds):
        for isa, ms in ours_ms(n).items():
            runs.setdefault(f"ours {isa}", []).append(ms)
        for name, kwargs in variants:
            runs.setdefault(f"torch {name}", []).append(torch_ms(n, kwargs))
    return runs

header_done = False
for n in sizes:
    runs = measure(n)
    cases = list(runs)
    if not header_done:
        print("| params | " + " | ".join(f"{c} Mparam/s" for c in cases) +
              " | speedup (ours best / torch best) | spread |")
        print("|---:|" + "---:|" * (len(cases) + 2))
        header_done = True
    rate = {c: n / min(ms) / 1e3 for c, ms in runs.items()}
    best_ours = max(r for c, r in rate.items() if c.startswith("ours"))
    best_torch = max(r for c, r in rate.items() if c.startswith("torch"))
    spread = max(max(ms) / min(ms) for ms in runs.values())
    label = f"{n / 2**20:.1f}M" if n % 2**20 else f"{n // 2**20}M"
    print(f"| {label} ({n}) | " + " | ".join(f"{rate[c]:.0f}" for c in cases) +
          f" | {best_ours / best_torch:.1f}x | {spread:.2f} |", flush=True)
EOF
echo "# load average at end: $(cut -d' ' -f1-3 /proc/loadavg)"
