#!/usr/bin/env bash
# Launch and tear-down latency of dslaunch over SSH (--launcher ssh) against
# pdsh (the way DeepSpeed's pdsh runner fans out), on real test clusters of
# network namespaces with one sshd each (tests/cluster/cluster.sh), 1, 3 and 8
# nodes with SLOTS ranks per node, all on this one machine. Needs root.
#
# usage: bench/launch_cluster.sh [--runs N] [--quick] [--nodes "1 3 8"]
#   --runs N     measured runs per launcher and cluster size (default 10)
#   --quick      3 runs
#   --nodes L    cluster sizes, blank-separated (default "1 3 8")
# env: SLOTS       ranks per node (default 2)
#      DSLAUNCH_BUILD  build directory holding bin/dslaunch and bin/dsagent
#                      (default: <script dir>/../build)
#      BENCH_SETTLE_MS pause of the failing rank after all ranks started (20)
#      BENCH_RUN_TIMEOUT_S  a run that takes longer is killed and counted as
#                      failed (30)
#      BENCH_PDSH_CAP_S  how long pdsh may take to exit after the failing rank
#                      exited before it counts as "never" and is killed (3)
#      BENCH_NODE_GRACE_S  how long processes other than the node's sshd may
#                      linger on a node after dslaunch returned (3)
#
# One run measures both numbers:
#   launch    = (latest rank start) - (instant just before the launcher is
#               fork()ed). Each rank is a tiny C program (bench/benchhelper.c)
#               that, first thing in main(), writes clock_gettime(CLOCK_REALTIME)
#               (shared by all namespaces) and its pid to DIR/start.<rank> (DIR
#               is shared too: the nodes differ only in their network namespace).
#   teardown  = (launcher's waitpid() returned) - (instant the failing rank
#               calls _exit(1)). The last rank (on the last node) waits until
#               every rank has written its start file, sleeps BENCH_SETTLE_MS,
#               records the time and exits 1; all other ranks sleep 60 s and
#               must be killed.
#   dslaunch: right after it returns, every rank pid is checked (kill -0 and
#   /proc/<pid>/stat not a zombie: a live rank is an ERROR), then every node
#   (`cluster.sh pids`) must hold nothing but its sshd daemon (zombies count as
#   gone) within BENCH_NODE_GRACE_S, else ERROR.
#   pdsh does not stop the other nodes when one fails: if it has not exited
#   BENCH_PDSH_CAP_S after the failing rank's exit, the ranks still alive are
#   counted, pdsh is SIGTERMed, the ranks still alive are counted again, and
#   the bench kills them (rank pids, then anything else on the nodes).
#
# dslaunch: --launcher ssh with the cluster's key, known_hosts and hostfile
# (SLOTS slots per node). pdsh: `pdsh -S -f 1024 -R ssh -w n1,n2,... CMD` with
# PDSH_SSH_ARGS_APPEND from the cluster's env; CMD starts SLOTS copies of the
# rank (RANK = %n * SLOTS + local rank) in the background and, like
# DeepSpeed's launch.py on each node, waits for them, and when one fails
# kills its local siblings and exits with that code.
set -euo pipefail

SCRIPT_DIR=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=bench/lib.sh
. "$SCRIPT_DIR/lib.sh"

usage() { sed -n '2,21p' "$0" | sed 's/^# \{0,1\}//'; }

RUNS=10
NODES_LIST="1 3 8"
while (($#)); do
  case "$1" in
    --runs) need_positive_int --runs "${2-}"; RUNS=$2; shift 2 ;;
    --runs=*) RUNS=${1#--runs=}; need_positive_int --runs "$RUNS"; shift ;;
    --quick) RUNS=3; shift ;;
    --nodes) [[ $# -ge 2 ]] || { echo "--nodes needs a list, e.g. \"1 3 8\"" >&2; exit 2; }
             NODES_LIST=$2; shift 2 ;;
    --nodes=*) NODES_LIST=${1#--nodes=}; shift ;;
    -h|--help) usage; exit 0 ;;
    *) echo "unknown argument: $1" >&2; usage >&2; exit 2 ;;
  esac
done
read -r -a NODE_COUNTS <<<"$NODES_LIST"
((${#NODE_COUNTS[@]})) || { echo "--nodes: empty list" >&2; exit 2; }
for n in "${NODE_COUNTS[@]}"; do
  if ! [[ $n =~ ^[1-9][0-9]*$ ]] || ((n > 253)); then
    echo "--nodes: '$n' is not a node count 1..253" >&2; exit 2
  fi
done

SLOTS=${SLOTS:-2}
[[ $SLOTS =~ ^[1-9][0-9]*$ ]] || { echo "SLOTS must be a positive integer" >&2; exit 2; }
export SLOTS   # cluster.sh writes it into the hostfile
SETTLE_MS=${BENCH_SETTLE_MS:-20}
RUN_TIMEOUT_MS=$(( ${BENCH_RUN_TIMEOUT_S:-30} * 1000 ))
PDSH_CAP_S=${BENCH_PDSH_CAP_S:-3}
PDSH_CAP_MS=$(( PDSH_CAP_S * 1000 ))
NODE_GRACE_S=${BENCH_NODE_GRACE_S:-3}

REPO=$(cd "$SCRIPT_DIR/.." && pwd)
BUILD=${DSLAUNCH_BUILD:-$REPO/build}
need_build_bins "$BUILD"
[[ $(id -u) -eq 0 ]] || { echo "needs root (tests/cluster/cluster.sh builds network namespaces)" >&2; exit 77; }
PDSH=$(command -v pdsh || true)
[[ -n "$PDSH" ]] || { echo "pdsh not found (apt-get install pdsh)" >&2; exit 2; }
need_cc

bench_init launch_cluster

# The binaries are copied first: a rebuild while the bench runs must not mix
# versions (dslaunch uses the dsagent next to itself; the nodes share files).
mkdir -p "$WORK/bin"
cp "$BUILD/bin/dslaunch" "$BUILD/bin/dsagent" "$WORK/bin/"
DSLAUNCH=$WORK/bin/dslaunch
BIN_TIME=$(date -u -r "$BUILD/bin/dslaunch" '+%Y-%m-%d %H:%M UTC')

build_helper

alive() {  # exists and is not a zombie
  local st
  st=$(cat "/proc/$1/stat" 2>/dev/null) || return 1
  st=${st##*) }
  [[ ${st%% *} != [ZX] ]]
}

# node_procs -> "I:PID:COMM" for every live process on any node but its sshd
# shellcheck disable=SC2153  # CLUSTER_N comes from the cluster's env file
node_procs() {
  local i sshd p
  for ((i = 1; i <= CLUSTER_N; i++)); do
    sshd=$(cat "$CLUSTER_DIR/node$i/sshd.pid")
    while read -r p; do
      [[ -n $p && $p != "$sshd" ]] || continue
      alive "$p" || continue
      echo "$i:$p:$(cat "/proc/$p/comm" 2>/dev/null || echo gone)"
    done < <("$CLUSTER_SH" pids "$CLUSTER_DIR" "$i" || true)
  done
}

# wait_nodes_clean SECONDS -> 0 when every node holds only its sshd in time;
# sets NODE_LEFT to what was there at the last look
wait_nodes_clean() {
  local end=$((SECONDS + $1))
  while :; do
    NODE_LEFT=$(node_procs)
    [[ -n $NODE_LEFT ]] || return 0
    ((SECONDS < end)) || return 1
    sleep 0.05
  done
}

# kill_everything_on_nodes: rank pids first (by their start files), then
# anything else but the sshd daemons
kill_everything_on_nodes() {
  local dir=$1 f pid x round
  for f in "$dir"/start.*; do
    [[ -f $f ]] || continue
    read -r _ pid <"$f"
    kill -TERM "$pid" 2>/dev/null || true
  done
  for round in TERM TERM KILL KILL; do
    NODE_LEFT=$(node_procs)
    [[ -n $NODE_LEFT ]] || return 0
    for x in $NODE_LEFT; do
      pid=${x#*:}; pid=${pid%%:*}
      kill -"$round" "$pid" 2>/dev/null || true
    done
    sleep 0.2
  done
  NODE_LEFT=$(node_procs)
  [[ -z $NODE_LEFT ]]
}

# ------------------------------------------------------------- launchers ---
# cmd_for LAUNCHER DIR -> fills CMD array (for the cluster now up)
cmd_for() {
  local launcher=$1 dir=$2
  local world=$((CLUSTER_N * SLOTS))
  if [[ $launcher == dslaunch ]]; then
    CMD=("$DSLAUNCH" --hostfile "$CLUSTER_HOSTFILE" --launcher ssh
         --ssh_identity "$CLUSTER_KEY" --ssh_known_hosts "$CLUSTER_KNOWN_HOSTS"
         --ssh_user root --no_local_rank --env "$TAG"
         "$HELPER" rank "$dir" "$SETTLE_MS" ds)
  else
    # per node, like DeepSpeed's launch.py: start SLOTS ranks, wait; when one
    # fails, kill the local siblings and exit with its code (%n = node rank)
    local remote
    remote="export $TAG; cd /; pids=''; for l in \$(seq 0 $((SLOTS - 1))); do"
    remote+=" RANK=\$((%n * $SLOTS + l)) WORLD_SIZE=$world $HELPER rank $dir $SETTLE_MS ds &"
    remote+=" pids=\"\$pids \$!\"; done;"
    remote+=" for p in \$pids; do wait -n; rc=\$?;"
    remote+=" if [ \$rc -ne 0 ]; then kill \$pids 2>/dev/null; wait; exit \$rc; fi; done; exit 0"
    local hosts
    hosts=$(IFS=,; echo "${NODES[*]}")
    CMD=(env PDSH_RCMD_TYPE=ssh PDSH_SSH_ARGS_APPEND="$CLUSTER_PDSH_SSH_ARGS_APPEND"
         "$PDSH" -S -f 1024 -R ssh -w "$hosts" "$remote")
  fi
}

# one_run LAUNCHER -> sets RESULT to "OK launch_ns teardown_ns" or
# "CAPPED launch_ns alive_at_cap alive_after_kill" or ""
one_run() {
  local launcher=$1
  local n=$((CLUSTER_N * SLOTS)) dir=$WORK/run left cap=0
  local what="$launcher ${CLUSTER_N}x$SLOTS"
  rm -rf "$dir"; mkdir -p "$dir"
  cmd_for "$launcher" "$dir"
  [[ $launcher == pdsh ]] && cap=$PDSH_CAP_MS
  timed_run "$dir" "$n" "$cap" "$WORK/last.$launcher.log" "${CMD[@]}"
  RESULT=""
  # nodes: dslaunch must leave nothing (but the sshd) on any node
  if [[ $launcher == dslaunch ]]; then
    # first look right after the return: note what (if anything) lingers
    NODE_LEFT=$(node_procs)
    if [[ -n $NODE_LEFT ]]; then
      echo "$NODE_LEFT" | cut -d: -f3 | sort | uniq -c | awk '{printf "%s%s x%s", NR > 1 ? ", " : "", $2, $1}' >>"$WORK/ds.linger"
      echo >>"$WORK/ds.linger"
    else
      echo clean >>"$WORK/ds.linger"
    fi
    if ! wait_nodes_clean "$NODE_GRACE_S"; then
      error "$what: still on the nodes ${NODE_GRACE_S} s after dslaunch returned (node:pid:comm): $NODE_LEFT"
    fi
  fi
  kill_everything_on_nodes "$dir" || error "$what: could not clean the nodes: $NODE_LEFT"
  # anything of this run still alive on this side (launcher, ssh clients)
  left=$("$HELPER" reap "$TAG" KILL)
  case "$LINE" in
    OK*) ok_result "$what" "$LINE" ;;
    CAPPED*)
      if [[ $launcher != pdsh ]]; then
        error "$what: unexpected result $LINE"
      else
        RESULT=$LINE
      fi
      ;;
    *) run_failed "$what" "$LINE" "$WORK/last.$launcher.log" ;;
  esac
  if [[ $left -ne 0 ]]; then
    error "$what: $left tagged process(es) of the run left behind (killed)"
  fi
  rm -rf "$dir"
}

# ----------------------------------------------------------------- header ---
bashrc_ms() {  # median of 5: sourcing root's ~/.bashrc (what every ssh login pays)
  local i
  for i in 1 2 3 4 5; do
    local a b
    a=$(date +%s%N)
    HOME=$(getent passwd root | cut -d: -f6) bash -c '. ~/.bashrc' >/dev/null 2>&1 </dev/null || true
    b=$(date +%s%N)
    echo $((b - a))
  done | median_ms
}
echo "# dslaunch cluster (SSH) launch benchmark, $(date -u '+%Y-%m-%d %H:%M UTC')"
machine_line
DIRTY=""
if [[ -n $(git -C "$REPO" --no-optional-locks status --porcelain --untracked-files=no 2>/dev/null) ]]; then
  DIRTY=" + uncommitted changes"
fi
echo "commit:   $(git -C "$REPO" rev-parse --short HEAD 2>/dev/null || echo unknown)$DIRTY, binaries built $BIN_TIME"
echo "dslaunch: $("$DSLAUNCH" --version 2>&1 | head -n1), dsagent: $("$WORK/bin/dsagent" --version 2>&1 | head -n1), libssh $(dpkg-query -W -f='${Version}' libssh-4 2>/dev/null || echo '?')"
echo "pdsh:     $("$PDSH" -V 2>&1 | head -n1) ($PDSH), rcmd ssh; $(ssh -V 2>&1) (client and sshd)"
echo "ssh login shell: $(getent passwd root | cut -d: -f7); sourcing root's ~/.bashrc takes $(bashrc_ms) ms (median of 5), paid by every ssh login of both tools"
echo "load average at start: $(cut -d' ' -f1-3 /proc/loadavg) (anything else running on these $(nproc) CPUs skews the numbers)"
echo "runs per cell: $RUNS (median), ranks per node: $SLOTS, settle before the failing rank exits: ${SETTLE_MS} ms, pdsh cap: ${PDSH_CAP_S} s"
echo

declare -A LAUNCH TEARDOWN LRANGE TRANGE NOTE LINGER
for nodes in "${NODE_COUNTS[@]}"; do
  printf '%s: cluster.sh up %d ...' "$nodes" "$nodes" >&2
  bench_cluster_up "$nodes"
  printf '\r%*s\r' 40 '' >&2
  for f in ds.launch ds.teardown ds.linger pdsh.launch pdsh.teardown pdsh.atcap pdsh.afterkill; do
    : >"$WORK/$f"
  done
  capped=0 measured=0
  # one discarded warm-up run each, then alternate so drift hits both alike
  one_run dslaunch
  one_run pdsh
  for ((r = 1; r <= RUNS; r++)); do
    printf '\r%s nodes: run %d/%d ' "$nodes" "$r" "$RUNS" >&2
    for launcher in dslaunch pdsh; do
      one_run "$launcher"
      p=ds; [[ $launcher == pdsh ]] && p=pdsh
      case "$RESULT" in
        OK*)
          read -r _ l t <<<"$RESULT"
          echo "$l" >>"$WORK/$p.launch"
          echo "$t" >>"$WORK/$p.teardown"
          [[ $p == pdsh ]] && measured=$((measured + 1))
          ;;
        CAPPED*)
          read -r _ l atcap afterkill <<<"$RESULT"
          echo "$l" >>"$WORK/pdsh.launch"
          echo "$atcap" >>"$WORK/pdsh.atcap"
          echo "$afterkill" >>"$WORK/pdsh.afterkill"
          measured=$((measured + 1)); capped=$((capped + 1))
          ;;
      esac
    done
  done
  printf '\r%*s\r' 30 '' >&2
  bench_cluster_down
  for p in ds pdsh; do
    LAUNCH[$p.$nodes]=$(median_ms <"$WORK/$p.launch")
    LRANGE[$p.$nodes]=$(range_ms <"$WORK/$p.launch")
    TEARDOWN[$p.$nodes]=$(median_ms <"$WORK/$p.teardown")
    TRANGE[$p.$nodes]=$(range_ms <"$WORK/$p.teardown")
  done
  # the warm-up run's line is the first one
  clean=$(tail -n +2 "$WORK/ds.linger" | grep -c '^clean$' || true)
  total=$(tail -n +2 "$WORK/ds.linger" | wc -l)
  LINGER[$nodes]="nodes already clean at dslaunch's return in $clean/$total runs"
  if ((clean < total)); then
    LINGER[$nodes]+=" (else gone within ${NODE_GRACE_S} s; seen: $(tail -n +2 "$WORK/ds.linger" | grep -v '^clean$' | sort | uniq -c | awk '{c = $1; $1 = ""; printf "%s[%s] in %d run(s)", NR > 1 ? "; " : "", substr($0, 2), c}'))"
  fi
  others=$(( (nodes - 1) * SLOTS ))
  if ((capped == 0)); then
    NOTE[$nodes]="pdsh exited by itself in every run"
  else
    if ((capped == measured)); then
      TEARDOWN[pdsh.$nodes]="never: ranks left running on other nodes"
    else
      TEARDOWN[pdsh.$nodes]="never in $capped/$measured runs: ranks left running on other nodes"
    fi
    NOTE[$nodes]="pdsh still running ${PDSH_CAP_S} s after the failure in $capped/$measured runs; ranks alive then (median): $(median <"$WORK/pdsh.atcap") of the $others on other nodes; still alive 0.3 s after pdsh was SIGTERMed: $(median <"$WORK/pdsh.afterkill") (killed by the bench)"
  fi
done

fmt='| %5s | %5s | %18s | %14s | %20s | %-40s |\n'
# shellcheck disable=SC2059
printf "$fmt" nodes ranks "dslaunch launch ms" "pdsh launch ms" "dslaunch teardown ms" "pdsh teardown ms"
printf '|------:|------:|-------------------:|---------------:|---------------------:|------------------------------------------|\n'
for nodes in "${NODE_COUNTS[@]}"; do
  # shellcheck disable=SC2059
  printf "$fmt" "$nodes" $((nodes * SLOTS)) "${LAUNCH[ds.$nodes]}" "${LAUNCH[pdsh.$nodes]}" \
    "${TEARDOWN[ds.$nodes]}" "${TEARDOWN[pdsh.$nodes]}"
done
echo
echo "min-max ms (launch dslaunch / pdsh; teardown dslaunch / pdsh):"
for nodes in "${NODE_COUNTS[@]}"; do
  echo "  $nodes nodes: ${LRANGE[ds.$nodes]} / ${LRANGE[pdsh.$nodes]}; ${TRANGE[ds.$nodes]} / ${TRANGE[pdsh.$nodes]}"
done
echo
echo "after each run:"
for nodes in "${NODE_COUNTS[@]}"; do
  echo "  $nodes nodes: dslaunch: ${LINGER[$nodes]}"
  echo "  $nodes nodes: pdsh: ${NOTE[$nodes]}"
done
echo
echo "load average at the end: $(cut -d' ' -f1-3 /proc/loadavg)"
echo "launch = last rank started - launcher invoked; teardown = failing rank's exit(1) - launcher returned."
echo "dslaunch: --launcher ssh; checked after every run: launcher exit code 1, no rank alive, nothing but sshd on any node."
echo "pdsh: -S -f 1024 -R ssh; per node a shell starts $SLOTS ranks, waits, kills its siblings when one fails (like launch.py)."
exit_on_errors
