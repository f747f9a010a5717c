#!/usr/bin/env bash
# The GPU check of dsworker's CUDA engine: one command for a borrowed
# machine with one NVIDIA GPU, CUDA 13 and PyTorch, and nothing of ours.
#
# Here, after a build with the CUDA engine (build/bin/libdsl_cuda.so):
#   bench/gpu_check.sh --pack
# packs dsworker, libdsl_cuda.so, cuda_tests and the shared libraries they
# need that are not the C/C++ runtime or CUDA's (OpenBLAS, Gloo, yaml-cpp,
# ...) into .gpu/bundle.tar.xz (ignored by git; carry .gpu to the GPU).
#
# There:
#   bench/gpu_check.sh OUTDIR
# unpacks the bundle, runs the gpu tests (cuda_tests: every kernel against
# the CPU reference, training against the CPU engine), then the benchmark:
# GPT-2 124M (12 layers, 12 heads, 768 wide, T 1024) tokens/s and MFU for
# dsworker in bf16 and fp32 next to PyTorch on the same GPU, same model,
# batch and optimizer (bench/torch_gpt2_gpu.py: bf16 autocast with
# torch.compile and SDPA, and eager), and last compute-sanitizer's memcheck
# over the kernel tests. OUTDIR gets table.md, summary.txt and the logs.
#
# env: BATCH micro-batch (16)  STEPS (20)  WARMUP steps left out (5)
#      TORCH_STEPS (30)  TORCH_WARMUP (10)  SKIP_TORCH=1  SKIP_SANITIZER=1
#      SANITIZE=1: memcheck even when the tests pass
#      QUICK=1: PyTorch's compiled bf16 run only
#      SKIP_ZERO=1  ZSTEPS steps of each ZeRO run (6)  ZTIMEOUT each ZeRO run's limit (180 s)
#      MODES dsworker's modes benchmarked ("bf16 bf16+batched fp16 tf32 fp32";
#        +batched: DSL_CUDA_ATTENTION=batched, +fp32acts: DSL_CUDA_ACTIVATIONS=fp32,
#        +nolt: DSL_CUDA_LT=0)
#      PROFILE_MODES the modes profiled ("bf16 bf16+batched tf32"; empty: none)
#      TRIAGE_S: seconds for rerunning failed gpu tests under each fallback (180)
#      KERNELS=1: each kernel's GPU time in a bf16 step, from Nsight Compute,
#        and what bounds each fused attention kernel (ncu_*.txt, about 60 s)
#      PEAK_TFLOPS dense bf16 peak for MFU (989.5, H100/H200 SXM)
set -uo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
BUNDLE=$ROOT/.gpu/bundle.tar.xz

if [[ "${1:-}" == "--pack" ]]; then
  BUILD=${DSLAUNCH_BUILD:-$ROOT/build}
  bins=("$BUILD/bin/dsworker" "$BUILD/bin/libdsl_cuda.so" "$BUILD/bin/cuda_tests"
        "$BUILD/bin/dslaunch" "$BUILD/bin/dsagent")
  for b in "${bins[@]}"; do
    [[ -f "$b" ]] || { echo "no $b: build with the CUDA engine first" >&2; exit 1; }
  done
  stage=$(mktemp -d)
  trap 'rm -rf "$stage"' EXIT
  mkdir -p "$stage/bin" "$stage/lib"
  cp "${bins[@]}" "$stage/bin/"
  # Everything the binaries load but the C/C++ runtime (the GPU machine's
  # own is newer) and CUDA's libraries (the GPU machine has its own).
  ldd "${bins[@]}" | awk '/=> \//{print $1, $3}' | sort -u |
    while read -r name path; do
      case "$name" in
        libc.so*|libm.so*|libdl.so*|librt.so*|libpthread.so*|libstdc++.so*|\
        libgcc_s.so*|ld-linux*|libcublas*|libcudart*|libnccl*|libdsl_cuda.so) continue ;;
      esac
      cp -L "$path" "$stage/lib/$name"
    done
  mkdir -p "$ROOT/.gpu"
  tar -C "$stage" -cJf "$BUNDLE" bin lib
  ls -l "$BUNDLE"
  tar -tJvf "$BUNDLE"
  exit 0
fi

OUT=${1:?usage: bench/gpu_check.sh OUTDIR | --pack}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
BATCH=${BATCH:-16}
STEPS=${STEPS:-20}
WARMUP=${WARMUP:-5}
TORCH_STEPS=${TORCH_STEPS:-30}
TORCH_WARMUP=${TORCH_WARMUP:-10}
PEAK_TFLOPS=${PEAK_TFLOPS:-989.5}
PY=${PYTHON:-python3}
SUMMARY=$OUT/summary.txt
say() { echo "$*" | tee -a "$SUMMARY"; }
t_start=$(date +%s)
elapsed() { echo "$(($(date +%s) - t_start)) s"; }

[[ -f "$BUNDLE" ]] || { echo "no $BUNDLE: run bench/gpu_check.sh --pack where it was built, and carry .gpu" >&2; exit 1; }
WORK=$(mktemp -d /tmp/dsl_gpu.XXXXXX)
tar -C "$WORK" -xJf "$BUNDLE"
DSW=$WORK/bin/dsworker

# CUDA 13's cuBLAS: the toolkit's, else the pip wheel's that PyTorch uses.
CUBLAS_DIR=
for d in /usr/local/cuda/lib64 /usr/local/cuda/lib /usr/local/cuda/targets/x86_64-linux/lib; do
  [[ -e "$d/libcublas.so.13" ]] && { CUBLAS_DIR=$d; break; }
done
if [[ -z "$CUBLAS_DIR" ]]; then
  CUBLAS_DIR=$(dirname "$(find / -name 'libcublas.so.13' -not -path '/proc/*' 2>/dev/null | head -1)" 2>/dev/null)
fi
# NCCL (dsworker opens libnccl.so.2 itself): the toolkit's, else PyTorch's.
NCCL_DIR=$CUBLAS_DIR
if [[ ! -e "$NCCL_DIR/libnccl.so.2" ]]; then
  NCCL_DIR=$($PY -c 'import nvidia.nccl, os; print(os.path.join(list(nvidia.nccl.__path__)[0], "lib"))' 2>/dev/null)
fi
[[ -e "$NCCL_DIR/libnccl.so.2" ]] || NCCL_DIR=$(dirname "$(find / -name 'libnccl.so.2' -not -path '/proc/*' 2>/dev/null | head -1)" 2>/dev/null)
export LD_LIBRARY_PATH=$WORK/lib:$WORK/bin${CUBLAS_DIR:+:$CUBLAS_DIR}${NCCL_DIR:+:$NCCL_DIR}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}

say "# dsworker GPU check, $(date -u +%FT%TZ)"
say "gpu: $(nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv,noheader 2>&1)"
say "cublas: ${CUBLAS_DIR:-not found}; nccl: ${NCCL_DIR:-not found}; nvcc: $(nvcc --version 2>/dev/null | tail -1)"
say "torch: $($PY -c 'import torch; print(torch.__version__, torch.version.cuda)' 2>&1 | tail -1)"
say "cpu cores: $(nproc)"
ldd "$DSW" "$WORK/bin/libdsl_cuda.so" | grep 'not found' | tee -a "$SUMMARY"

# ---------------------------------------------------------------- tests
say ""
say "## gpu tests ($(elapsed))"
# The NCCL tests apart, with a limit of their own: a hang there (NCCL's
# abort of a join that cannot finish, never run before) must not cost the
# other tests' results.
(cd "$WORK" && timeout 300 "$WORK/bin/cuda_tests" --gtest_color=no \
   --gtest_filter='-*Nccl*' --gtest_output="xml:$OUT/cuda_tests.xml") >"$OUT/cuda_tests.log" 2>&1
tests_rc=$?
(cd "$WORK" && timeout 120 "$WORK/bin/cuda_tests" --gtest_color=no \
   --gtest_filter='*Nccl*' --gtest_output="xml:$OUT/cuda_tests_nccl.xml") >"$OUT/cuda_tests_nccl.log" 2>&1
nccl_rc=$?
say "cuda_tests exit $tests_rc; the NCCL ones exit $nccl_rc"
grep -hE '^\[  (PASSED|FAILED|SKIPPED) |^(fp32|bf16|fp16|fused attention|nccl|2 ranks)|matmul relative|Failure|Expected|Which is|which is|  Actual|error' \
  "$OUT/cuda_tests.log" "$OUT/cuda_tests_nccl.log" | head -80 | tee -a "$SUMMARY"

# Which switch mends a failure: each failed test again under each of the
# engine's fallbacks, one at a time (DSL_CUDA_LT=0: no cuBLASLt epilogue;
# DSL_CUDA_COPY_STREAM=0: window copies in line; DSL_CUDA_ACTIVATIONS=fp32:
# no rounded activations; DSL_CUDA_ATTENTION=batched: no fused attention).
failed=$(grep -hoE '^\[  FAILED  \] [A-Za-z][A-Za-z0-9_/.]*' "$OUT/cuda_tests.log" | awk '{print $4}' | sort -u | paste -sd: -)
if [[ -n "$failed" ]]; then
  say ""
  say "## failed tests under each fallback ($(elapsed))"
  # At most TRIAGE_S seconds for all of them (a GPU's time is short).
  triage_end=$(($(date +%s) + ${TRIAGE_S:-180}))
  for fallback in DSL_CUDA_LT=0 DSL_CUDA_COPY_STREAM=0 DSL_CUDA_ACTIVATIONS=fp32 DSL_CUDA_ATTENTION=batched; do
    left=$((triage_end - $(date +%s)))
    ((left > 10)) || { say "$fallback: not run (TRIAGE_S spent)"; continue; }
    (cd "$WORK" && env "$fallback" timeout "$left" "$WORK/bin/cuda_tests" --gtest_color=no \
       --gtest_filter="$failed") >"$OUT/triage_${fallback%%=*}.log" 2>&1
    say "$fallback: exit $? ($(grep -cE '^\[       OK \]' "$OUT/triage_${fallback%%=*}.log") of the failed tests pass)"
    grep -hE '^\[  FAILED  \] [A-Za-z]' "$OUT/triage_${fallback%%=*}.log" | sort -u | tee -a "$SUMMARY"
  done
fi

# ---------------------------------------------------------------- benchmark
say ""
say "## GPT-2 124M, B $BATCH, T 1024 ($(elapsed))"
DATA=$WORK/tokens.bin
$PY - "$DATA" <<'EOF'
import sys, numpy as np
n = 1 << 22
rng = np.random.default_rng(1337)
hdr = np.zeros(256, dtype=np.int32); hdr[0] = 20240520; hdr[1] = 1; hdr[2] = n
with open(sys.argv[1], "wb") as f:
    f.write(hdr.tobytes()); f.write(rng.integers(0, 50257, n, dtype=np.uint16).tobytes())
EOF

cat >"$WORK/gpt2.json" <<EOF
{"train_micro_batch_size_per_gpu": $BATCH, "gradient_accumulation_steps": 1,
 "gradient_clipping": 1.0, "steps_per_print": 1,
 "optimizer": {"type": "AdamW", "params": {"lr": 0.0006, "weight_decay": 0.1}},
 "zero_optimization": {"stage": 0},
 "model": {"n_layer": 12, "n_head": 12, "n_embd": 768, "seq_len": 1024, "vocab_size": 50257},
 "data": {"train": "$DATA", "shuffle": false},
 "train": {"steps": $STEPS, "seed": 1}}
EOF

# median tok/s of dsworker's step lines after the warm-up
median_steps() {
  awk -v w="$WARMUP" '$1 == "step" && $2 > w { for (i = 1; i <= NF; i++) if ($(i+1) == "tok/s") print $i }' "$1" |
    sort -n | awk '{a[NR] = $1} END { if (NR == 0) print 0; else print a[int((NR + 1) / 2)] }'
}
gpu_mem() { awk '/gpu_mem/ { for (i = 1; i <= NF; i++) if ($i == "gpu_mem") m = $(i+1) } END { print m }' "$1"; }
# tokens per second -> MFU at PEAK_TFLOPS (llm.c's count: 6 N + 6 L C T per token)
mfu() { $PY -c "
N = 124475904  # GPT-2 124M with the padded 50304-row embedding
print('%.1f%%' % (100 * float('$1') * (6 * N + 6 * 12 * 768 * 1024) / ($2 * 1e12)))"; }

declare -a ROWS
# A mode's engine environment (MODE_ENV) and precision as dsworker's --set
# arguments (MODE_SETS).
mode_args() {
  MODE_ENV=("DSL_CUDA_TF32=$([[ $1 == tf32 ]] && echo 1 || echo 0)"
            "DSL_CUDA_ATTENTION=$([[ $1 == *batched* ]] && echo batched || echo fused)"
            "DSL_CUDA_ACTIVATIONS=$([[ $1 == *fp32acts* ]] && echo fp32 || echo 16bit)"
            "DSL_CUDA_LT=$([[ $1 == *nolt* ]] && echo 0 || echo 1)")
  MODE_SETS=(--set "bf16.enabled=$([[ $1 == bf16* ]] && echo true || echo false)"
             --set "fp16.enabled=$([[ $1 == fp16* ]] && echo true || echo false)")
}
run_dsworker() {  # mode (bf16[+batched][+fp32acts][+nolt], fp16, fp32, tf32), peak TFLOP/s
  local mode=$1 peak=$2 log=$OUT/bench_dsworker.log tps rc
  echo "### dsworker $mode" >>"$log"
  mode_args "$mode"
  (cd "$WORK" && env "${MODE_ENV[@]}" timeout 240 "$DSW" train --config "$WORK/gpt2.json" --device cuda \
     "${MODE_SETS[@]}" "${@:3}") >"$WORK/run.log" 2>&1
  rc=$?
  cat "$WORK/run.log" >>"$log"
  tps=$(median_steps "$WORK/run.log")
  say "dsworker $mode: exit $rc, median $tps tok/s, peak $(gpu_mem "$WORK/run.log") GiB"
  grep -E '^train:|dsworker:' "$WORK/run.log" | head -3 | tee -a "$SUMMARY"
  ROWS+=("| dsworker | $mode | $tps | $(mfu "$tps" "$peak") | $(gpu_mem "$WORK/run.log") GiB |")
}
: >"$OUT/bench_dsworker.log"
# peak TFLOP/s of each mode (H100/H200 SXM dense); bf16+batched: attention
# through the batched products instead of the fused kernels
for mode in ${MODES-bf16 bf16+batched fp16 tf32 fp32}; do
  case $mode in
    tf32) run_dsworker "$mode" 494.7 ;;
    fp32) run_dsworker "$mode" 66.9 ;;
    *) run_dsworker "$mode" "$PEAK_TFLOPS" ;;
  esac
done
# Where the GPU time goes (DSL_CUDA_PROFILE: events between the parts of a
# step; a separate short run, so the timings above carry no events).
for mode in ${PROFILE_MODES-bf16 bf16+batched tf32}; do
  mode_args "$mode"
  (cd "$WORK" && env DSL_CUDA_PROFILE=1 "${MODE_ENV[@]}" timeout 120 "$DSW" train --config "$WORK/gpt2.json" \
     --device cuda --set train.steps=6 "${MODE_SETS[@]}") >"$WORK/profile.log" 2>&1
  say "profile $mode (6 steps, the first with its start-up):"
  grep -A11 'GPU time per step' "$WORK/profile.log" | tee -a "$SUMMARY"
done

# ---------------------------------------------------------------- kernels
# Each kernel's GPU time over a 3-step bf16 run (the first step's start-up
# included), from Nsight Compute's gpu__time_duration with the clocks and
# caches left alone, summed by kernel name: what the profile's parts are
# made of.
if [[ -n "${KERNELS:-}" ]] && command -v ncu >/dev/null; then
  say ""
  say "## kernels, bf16, 3 steps ($(elapsed))"
  (cd "$WORK" && timeout 300 ncu --clock-control none --cache-control none \
     --metrics gpu__time_duration.sum --csv --print-units base \
     --log-file "$OUT/kernels.csv" "$DSW" train --config "$WORK/gpt2.json" \
     --device cuda --set train.steps=3 --set bf16.enabled=true) >"$OUT/kernels.log" 2>&1
  say "ncu exit $?"
  $PY - "$OUT/kernels.csv" <<'EOF2' | tee -a "$SUMMARY"
import csv, collections, sys
rows = [l for l in open(sys.argv[1]) if l.startswith('"')]
total, count = collections.Counter(), collections.Counter()
for r in csv.DictReader(rows):
    if r.get("Metric Name") != "gpu__time_duration.sum":
        continue
    name = r["Kernel Name"].split("(")[0][:90]
    total[name] += float(r["Metric Value"].replace(",", ""))
    count[name] += 1
all_ns = sum(total.values())
print("%d launches, %.1f ms a step" % (sum(count.values()), all_ns / 3e6))
for name, ns in total.most_common(40):
    print("%8.2f ms %5.1f%% %6d  %s" % (ns / 3e6, 100 * ns / all_ns, count[name], name))
EOF2
  # What bounds the fused attention: each of its three kernels once (the
  # 12th launch of each in a 1-step run: the forward's last layer, the
  # backward's first), with Nsight Compute's throughput, occupancy and
  # warp-stall sections; the details page in full.
  for k in FlashForwardKernel FlashBackwardKvKernel FlashBackwardQKernel; do
    say "## $k ($(elapsed))"
    (cd "$WORK" && timeout 90 ncu -k "regex:$k" --launch-skip 11 --launch-count 1 \
       --section SpeedOfLight --section Occupancy --section LaunchStats \
       --section WarpStateStats --section ComputeWorkloadAnalysis \
       --section MemoryWorkloadAnalysis "$DSW" train --config "$WORK/gpt2.json" \
       --device cuda --set train.steps=1 --set bf16.enabled=true) >"$OUT/ncu_$k.txt" 2>&1
    say "ncu exit $?"
    grep -E 'Duration|Throughput|Registers Per|Achieved Occupancy|Theoretical Occupancy|Warp Cycles Per Issued|Issue Slots Busy|Bank Conflicts|Shared Memory|Est\. Speedup|stall' \
      "$OUT/ncu_$k.txt" | head -40 | tee -a "$SUMMARY"
  done
fi

# ---------------------------------------------------------------- ZeRO
# ZeRO stages 0-3 and the optimizer offloaded to the CPU, bf16: each rank's
# step rate, GPU allocator peak and model state, from dslaunch's
# metrics.jsonl, for one rank and for 2 ranks sharing the GPU (their
# gradients reduced over Gloo through host memory).
ZSTEPS=${ZSTEPS:-6}
declare -a ZROWS
run_zero() {  # label, ranks, dsworker --set KEY=VALUE...
  local label=$1 world=$2 log=$OUT/bench_zero.log rc s
  shift 2
  local sets=(--set bf16.enabled=true --set "train.steps=$ZSTEPS")
  for s in "$@"; do sets+=(--set "$s"); done
  echo "### $label, $world rank(s)" >>"$log"
  rm -rf "$WORK/zlogs"
  echo "127.0.0.1 slots=$world" >"$WORK/hosts"
  (cd "$WORK" && timeout "${ZTIMEOUT:-180}" "$WORK/bin/dslaunch" --hostfile "$WORK/hosts" \
     --log_dir "$WORK/zlogs" "$DSW" train --config "$WORK/gpt2.json" --device cuda \
     "${sets[@]}") >"$WORK/zero.log" 2>&1
  rc=$?
  cat "$WORK/zero.log" >>"$log"
  ZROWS+=("$($PY - "$WORK/zlogs/metrics.jsonl" "$label" "$world" "$rc" <<'EOF'
import json, statistics, sys
path, label, world, rc = sys.argv[1:]
last, rates = {}, []
try:
    for line in open(path):
        r = json.loads(line)
        if "rank" in r and "step" in r:
            last[r["rank"]] = r
            if r["rank"] == 0 and r["step"] > 2:
                rates.append(r.get("tokens_per_s", 0) * int(world))
except OSError:
    pass
gib = lambda b: "%.2f" % (b / 2**30) if b is not None else "?"
r0 = last.get(0, {})
print("| %s | %s | %s | %s GiB | %s GiB | exit %s |" % (
    label, world, "%.0f" % statistics.median(rates) if rates else "failed",
    gib(r0.get("gpu_mem_bytes")), gib(r0.get("model_state_bytes")), rc))
EOF
)")
  say "${ZROWS[-1]}"
}
if [[ -z "${SKIP_ZERO:-}" ]]; then
  say ""
  say "## ZeRO on the GPU, bf16, B $BATCH ($(elapsed))"
  : >"$OUT/bench_zero.log"
  run_zero "stage 2, offload_optimizer cpu" 1 zero_optimization.stage=2 \
    zero_optimization.offload_optimizer.device=cpu
  for st in 0 1 2 3; do
    run_zero "stage $st" 2 "zero_optimization.stage=$st"
  done
  for st in 2 3; do
    run_zero "stage $st, offload_optimizer cpu" 2 "zero_optimization.stage=$st" \
      zero_optimization.offload_optimizer.device=cpu
  done
fi

run_torch() {  # name, args...
  local name=$1 log=$OUT/bench_torch.log
  shift
  echo "### torch $name" >>"$log"
  timeout 300 $PY "$ROOT/bench/torch_gpt2_gpu.py" --batch "$BATCH" --seq 1024 \
    --steps "$TORCH_STEPS" --warmup "$TORCH_WARMUP" --data "$DATA" "$@" >>"$log" 2>&1
  local rc=$? tps mem
  tps=$(awk '/^median_tok_s/ {print $2}' "$log" | tail -1)
  mem=$(awk '/^peak_mem_bytes/ {printf "%.2f", $2 / 2^30}' "$log" | tail -1)
  say "torch $name: exit $rc, median ${tps:-?} tok/s, peak ${mem:-?} GiB"
  ROWS+=("| PyTorch | $name | ${tps:-failed} | $(awk '/^mfu/ {print $2}' "$log" | tail -1) | ${mem:-?} GiB |")
}
if [[ -z "${SKIP_TORCH:-}" ]]; then
  : >"$OUT/bench_torch.log"
  run_torch "bf16 compile+SDPA" --dtype bf16 --compile 1
  if [[ -z "${QUICK:-}" ]]; then
    run_torch "tf32 eager+SDPA" --dtype tf32 --compile 0
    run_torch "fp32 eager+SDPA" --dtype fp32 --compile 0
  fi
fi

{
  echo ""
  echo "| engine | mode | tokens/s | MFU | GPU memory |"
  echo "|---|---|---|---|---|"
  printf '%s\n' "${ROWS[@]}"
  if [[ ${#ZROWS[@]} -gt 0 ]]; then
    echo ""
    echo "| ZeRO (bf16) | ranks | tokens/s (all ranks) | rank 0 GPU peak | rank 0 model state | |"
    echo "|---|---|---|---|---|---|"
    printf '%s\n' "${ZROWS[@]}"
  fi
} | tee "$OUT/table.md" | tee -a "$SUMMARY"

# ---------------------------------------------------------------- memcheck
# Only when a test failed (a wrong result may be a bad access), or asked.
if [[ -z "${SKIP_SANITIZER:-}" && ( $tests_rc != 0 || -n "${SANITIZE:-}" ) ]] &&
   command -v compute-sanitizer >/dev/null; then
  say ""
  say "## compute-sanitizer memcheck, kernel tests ($(elapsed))"
  timeout 150 compute-sanitizer --tool memcheck --print-limit 20 \
    "$WORK/bin/cuda_tests" --gtest_filter='KernelsTest.*' >"$OUT/sanitizer.log" 2>&1
  say "memcheck exit $?"
  grep -E 'ERROR SUMMARY|Invalid|PASSED|FAILED' "$OUT/sanitizer.log" | head -20 | tee -a "$SUMMARY"
fi
say "done ($(elapsed))"
