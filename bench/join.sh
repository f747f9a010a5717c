#!/usr/bin/env bash
# Join mode (dslaunch --launcher join): how long from the launcher's start
# until every rank runs, when the agents are already there and waiting, as
# worker pods would be. 1, 8 and 32 pods simulated in namespaces
# (tests/pods/pods.sh: per pod a network namespace, hostname, read-only /,
# non-root UID, JOB_COMPLETION_INDEX), and 256 agents as plain processes on
# 127.0.0.1 (--node_rank I). One rank per agent. Needs root for the pods.
#
# usage: bench/join.sh [--runs N] [--quick] [--pods "1 8 32"] [--agents N]
#   --runs N     measured runs per setup (default 5), after one warm-up run
#   --quick      3 runs
#   --pods L     pod counts, blank-separated (default "1 8 32")
#   --agents N   agents on loopback (default 256; 0: none)
# env: DSLAUNCH_BUILD  build directory holding bin/dslaunch and bin/dsagent
#                      (default: <script dir>/../build)
#      BENCH_HEAD_START_MS  how long the agents dial before the launcher
#                      starts (default 3000: their backoff has reached its
#                      250 ms cap, as for pods that wait for a launcher)
#      BENCH_SETTLE_MS pause of the failing rank after all ranks started (20)
#      BENCH_RUN_TIMEOUT_S  a run that takes longer is killed and counted as
#                      failed (30)
#
# One run: the N agents are started (pods: `pods.sh run DIR I dsagent --join
# dslaunch-launcher:29400 ...`; loopback: `dsagent --join 127.0.0.1:PORT
# --node_rank I ...`), BENCH_HEAD_START_MS pass, then the launcher is forked
# (pods: in the launcher pod through `pods.sh argv`, so that no bash start-up
# is timed; nsenter, setpriv and env exec into dslaunch) with --num_nodes N
# --num_gpus 1 --log_level info, and
#   launch = (latest rank start) - (instant just before the launcher is
#            fork()ed). Each rank is a tiny C program (bench/benchhelper.c)
#            that, first thing in main(), writes clock_gettime(CLOCK_REALTIME)
#            and its pid to DIR/start.<rank> (DIR: the pods' shared volume).
#   join   = (the launcher's last "node I (...) joined" log line, ms
#            resolution) - (the same instant); start = launch - join: the
#            plan, the job to every agent, and every rank's spawn.
# The last rank then waits for every start file, sleeps BENCH_SETTLE_MS and
# exits 1: checked after every run: the launcher exited 1, no rank alive
# when it returned, every agent exited 1 within 10 s, nothing left in a pod.
set -euo pipefail

SCRIPT_DIR=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=bench/lib.sh
. "$SCRIPT_DIR/lib.sh"

usage() { sed -n '2,22p' "$0" | sed 's/^# \{0,1\}//'; }

RUNS=5
PODS_LIST="1 8 32"
AGENTS=256
while (($#)); do
  case "$1" in
    --runs) need_positive_int --runs "${2-}"; RUNS=$2; shift 2 ;;
    --runs=*) RUNS=${1#--runs=}; need_positive_int --runs "$RUNS"; shift ;;
    --quick) RUNS=3; shift ;;
    --pods) [[ $# -ge 2 ]] || { echo "--pods needs a list, e.g. \"1 8 32\"" >&2; exit 2; }
            PODS_LIST=$2; shift 2 ;;
    --pods=*) PODS_LIST=${1#--pods=}; shift ;;
    --agents) need_count --agents "${2-}"; AGENTS=$2; shift 2 ;;
    --agents=*) AGENTS=${1#--agents=}; need_count --agents "$AGENTS"; shift ;;
    -h|--help) usage; exit 0 ;;
    *) echo "unknown argument: $1" >&2; usage >&2; exit 2 ;;
  esac
done
read -r -a POD_COUNTS <<<"$PODS_LIST"
MAX_PODS=0
for n in "${POD_COUNTS[@]}"; do
  if ! [[ $n =~ ^[1-9][0-9]*$ ]] || ((n > 200)); then
    echo "--pods: '$n' is not a pod count 1..200" >&2; exit 2
  fi
  ((n <= MAX_PODS)) || MAX_PODS=$n
done

HEAD_START_MS=${BENCH_HEAD_START_MS:-3000}
need_count BENCH_HEAD_START_MS "$HEAD_START_MS"
SETTLE_MS=${BENCH_SETTLE_MS:-20}
# shellcheck disable=SC2034  # read by timed_run (lib.sh)
RUN_TIMEOUT_MS=$(( ${BENCH_RUN_TIMEOUT_S:-30} * 1000 ))

REPO=$(cd "$SCRIPT_DIR/.." && pwd)
PODS_SH=$REPO/tests/pods/pods.sh
BUILD=${DSLAUNCH_BUILD:-$REPO/build}
need_build_bins "$BUILD"
if ((${#POD_COUNTS[@]})) && [[ $(id -u) -ne 0 ]]; then
  echo "needs root for the pods (tests/pods/pods.sh builds namespaces); --pods '' runs loopback only" >&2
  exit 77
fi
need_cc

PODS_DIR=""
bench_cleanup_more() {   # after the tagged processes are reaped
  if [[ -n "$PODS_DIR" ]]; then
    "$PODS_SH" down "$PODS_DIR" >/dev/null || echo "warning: pods.sh down $PODS_DIR failed" >&2
  fi
}
bench_init join
# The pods' UIDs run the helper and read the secret in here.
chmod 0755 "$WORK"

# The binaries are copied first: a rebuild while the bench runs must not mix versions.
mkdir -p "$WORK/bin"
cp "$BUILD/bin/dslaunch" "$BUILD/bin/dsagent" "$WORK/bin/"
DSLAUNCH=$WORK/bin/dslaunch
DSAGENT=$WORK/bin/dsagent
BIN_TIME=$(date -u -r "$BUILD/bin/dslaunch" '+%Y-%m-%d %H:%M UTC')
build_helper
chmod 0755 "$HELPER"
(umask 0077 && openssl rand -hex 32 >"$WORK/secret")

# ------------------------------------------------------------------- runs ---
AGENT_PIDS=()

# wait_agents WHAT: every agent exited 1 (the launcher's status) within 10 s,
# else ERROR (and the stragglers are killed)
wait_agents() {
  local what=$1 end=$((SECONDS + 10)) p code bad=0 late=()
  for p in "${AGENT_PIDS[@]}"; do
    while kill -0 "$p" 2>/dev/null && [[ $(cut -d' ' -f3 "/proc/$p/stat" 2>/dev/null) != Z ]]; do
      if ((SECONDS >= end)); then late+=("$p"); kill -KILL "$p" 2>/dev/null || true; break; fi
      sleep 0.02
    done
  done
  for p in "${AGENT_PIDS[@]}"; do
    code=0
    wait "$p" || code=$?
    ((code == 1)) || bad=$((bad + 1))
  done
  ((${#late[@]} == 0)) || error "$what: ${#late[@]} agent(s) still running 10 s after the launcher (killed)"
  ((bad == 0)) || { error "$what: $bad agent(s) did not exit 1; agents' output:"; tail -n 5 "$WORK/agents.log" | sed 's/^/    /' >&2; }
  AGENT_PIDS=()
}

# pods_clean: nothing but the pause process in any pod within 5 s
pods_clean() {
  local end=$((SECONDS + 5)) i left
  while :; do
    left=""
    for ((i = 0; i < MAX_PODS; i++)); do
      [[ -z $("$PODS_SH" pids "$PODS_DIR" "$i") ]] || left+=" $i"
    done
    if [[ -n $("$PODS_SH" pids "$PODS_DIR" launcher) ]]; then left+=" launcher"; fi
    [[ -n $left ]] || return 0
    ((SECONDS < end)) || { error "processes left in pod(s)$left"; return 1; }
    sleep 0.05
  done
}

# join_ns LOG LAUNCH_NS DIR -> launcher start .. last join (ns), from the
# launcher's log (local wall-clock time, ms) and the start files
join_ns() {
  local log=$1 launch=$2 dir=$3 last=0 t f t0 hms day
  for f in "$dir"/start.*; do
    read -r t _ <"$f"
    if ((t > last)); then last=$t; fi
  done
  t0=$((last - launch))
  hms=$(grep -E '^\[[0-9:.]+ launcher info\] node [0-9]+ \(.*\) joined:' "$log" |
        cut -c2-13 | sort | tail -n 1)
  [[ -n $hms ]] || { echo ""; return; }
  day=$(date -d "@$((t0 / 1000000000))" +%F)
  t=$(date -d "$day $hms" +%s%N)
  ((t >= t0 - 43200000000000)) || t=$((t + 86400000000000))  # past midnight
  echo $((t - t0))
}

# one_run SETUP N DIR: agents, head start, the timed launcher; appends to
# $WORK/SETUP.{launch,join} (warm-up: WARM=1, nothing appended)
one_run() {
  local setup=$1 n=$2 dir=$3 i left j port
  rm -rf "$dir"
  mkdir -m 0770 "$dir"
  : >"$WORK/agents.log"
  if [[ $setup == pods ]]; then
    # shellcheck disable=SC2153  # PODS_BIN, PODS_SECRET: from pods.sh's env file
    for ((i = 0; i < n; i++)); do
      "$PODS_SH" run "$PODS_DIR" "$i" -e "$TAG" -- "$PODS_BIN/dsagent" --join dslaunch-launcher:29400 \
        --secret_file "$PODS_SECRET" </dev/null >>"$WORK/agents.log" 2>&1 &
      AGENT_PIDS+=($!)
    done
    mapfile -d '' CMD < <("$PODS_SH" argv "$PODS_DIR" launcher -e "$TAG" -- "$PODS_BIN/dslaunch" \
      --launcher join --num_nodes "$n" --num_gpus 1 --secret_file "$PODS_SECRET" --no_local_rank \
      --log_level info "$HELPER" rank "$dir" "$SETTLE_MS" ds)
  else
    port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
    for ((i = 0; i < n; i++)); do
      env "$TAG" "$DSAGENT" --join "127.0.0.1:$port" --secret_file "$WORK/secret" --node_rank "$i" \
        </dev/null >>"$WORK/agents.log" 2>&1 &
      AGENT_PIDS+=($!)
    done
    CMD=("$DSLAUNCH" --launcher join --num_nodes "$n" --num_gpus 1 --secret_file "$WORK/secret"
         --control_addr 127.0.0.1 --control_port "$port" --no_local_rank --log_level info
         "$HELPER" rank "$dir" "$SETTLE_MS" ds)
  fi
  sleep "$(awk -v ms="$HEAD_START_MS" 'BEGIN { printf "%.3f", ms / 1000 }')"
  timed_run "$dir" "$n" 0 "$WORK/last.log" "${CMD[@]}"
  local what="$setup $n"
  wait_agents "$what"
  [[ $setup != pods ]] || pods_clean || true
  left=$("$HELPER" reap "$TAG" KILL)
  case "$LINE" in
    OK*)
      ok_result "$what" "$LINE"
      read -r _ l _ <<<"$RESULT"
      j=$(join_ns "$WORK/last.log" "$l" "$dir")
      [[ -n $j ]] || error "$what: no 'joined' line in the launcher's log"
      if ((!WARM)) && [[ -n $j ]]; then
        echo "$l" >>"$WORK/$setup$n.launch"
        echo "$j" >>"$WORK/$setup$n.join"
        echo $((l - j)) >>"$WORK/$setup$n.start"
      fi
      ;;
    *) run_failed "$what" "$LINE" "$WORK/last.log" ;;
  esac
  ((left == 0)) || error "$what: $left tagged process(es) of the run left behind (killed)"
  rm -rf "$dir"
}

# ----------------------------------------------------------------- header ---
echo "# dslaunch join-mode launch benchmark, $(date -u '+%Y-%m-%d %H:%M UTC')"
machine_line
DIRTY=""
if [[ -n $(git -C "$REPO" --no-optional-locks status --porcelain --untracked-files=no 2>/dev/null) ]]; then
  DIRTY=" + uncommitted changes"
fi
echo "commit:   $(git -C "$REPO" rev-parse --short HEAD 2>/dev/null || echo unknown)$DIRTY, binaries built $BIN_TIME"
echo "dslaunch: $("$DSLAUNCH" --version 2>&1 | head -n1), dsagent: $("$DSAGENT" --version 2>&1 | head -n1)"
echo "load average at start: $(cut -d' ' -f1-3 /proc/loadavg) (anything else running on these $(nproc) CPUs skews the numbers)"
echo "runs per setup: $RUNS (median) after one warm-up; agents dial ${HEAD_START_MS} ms before the launcher starts; 1 rank per agent"
echo

SETUPS=()
if ((${#POD_COUNTS[@]})); then
  printf 'pods.sh up %d ...' "$MAX_PODS" >&2
  PODS_DIR=$WORK/pods
  rc=0
  PODS_BIN=$WORK/bin "$PODS_SH" up "$MAX_PODS" "$PODS_DIR" >"$WORK/up.log" 2>&1 || rc=$?
  if ((rc != 0)); then
    cat "$WORK/up.log" >&2
    PODS_DIR=""   # a failed up tears itself down
    echo "pods.sh up $MAX_PODS failed (exit $rc)" >&2
    exit "$rc"
  fi
  set -a
  # shellcheck disable=SC1091
  . "$PODS_DIR/env"
  set +a
  printf '\r%*s\r' 40 '' >&2
  for n in "${POD_COUNTS[@]}"; do SETUPS+=("pods $n"); done
fi
((AGENTS == 0)) || SETUPS+=("loopback $AGENTS")

for s in "${SETUPS[@]}"; do
  read -r setup n <<<"$s"
  : >"$WORK/$setup$n.launch"; : >"$WORK/$setup$n.join"; : >"$WORK/$setup$n.start"
  dir=$WORK/run
  [[ $setup != pods ]] || dir=$PODS_VOLUME/run
  WARM=1
  printf '\r%s %d: warm-up ' "$setup" "$n" >&2
  one_run "$setup" "$n" "$dir"
  WARM=0
  for ((r = 1; r <= RUNS; r++)); do
    printf '\r%s %d: run %d/%d ' "$setup" "$n" "$r" "$RUNS" >&2
    one_run "$setup" "$n" "$dir"
  done
  printf '\r%*s\r' 30 '' >&2
done

fmt='| %-26s | %5s | %16s | %9s | %20s | %19s | %8s |\n'
# shellcheck disable=SC2059
printf "$fmt" setup ranks "launch ms (med)" "min-max" "until last join ms" "then all running ms" target
printf '|%s|------:|-----------------:|----------:|---------------------:|--------------------:|---------:|\n' \
  "----------------------------"
for s in "${SETUPS[@]}"; do
  read -r setup n <<<"$s"
  if [[ $setup == pods ]]; then
    label="$n pod$( ((n == 1)) || echo s) (namespaces)"
    target=""; ((n != 32)) || target="< 1000"
  else
    label="$n agents (loopback)"
    target=""; ((n != 256)) || target="< 2000"
  fi
  # shellcheck disable=SC2059
  printf "$fmt" "$label" "$n" "$(median_ms <"$WORK/$setup$n.launch")" \
    "$(range_ms <"$WORK/$setup$n.launch")" "$(median_ms <"$WORK/$setup$n.join")" \
    "$(median_ms <"$WORK/$setup$n.start")" "$target"
done
echo
echo "load average at the end: $(cut -d' ' -f1-3 /proc/loadavg)"
echo "launch = last rank started - launcher forked (agents already dialling); until last join = the"
echo "launcher's last 'node I joined' log line - launcher forked; then all running = launch - that."
exit_on_errors
