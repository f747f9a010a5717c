#!/usr/bin/env bash
# Restart latency: dslaunch --max_restarts against torchrun's elastic agent
# (--max_restarts, c10d rendezvous) restarting the same program on the same
# nodes, for job shapes 3x2 and 8x2 (nodes x ranks per node), all on this
# one machine: over "local" 127.0.0.1 .. 127.0.0.N are the nodes (one
# dsagent, or one torchrun agent, each); over "ssh" a test cluster of
# network namespaces with an sshd each (tests/cluster/cluster.sh, needs
# root), dslaunch with --launcher ssh and one torchrun agent started in each
# node's namespace (c10d store on node 0's agent: --rdzv_conf is_host=1;
# GLOO_SOCKET_IFNAME=eth0, the node's interface; and, in a UTS namespace of
# its own, the node's address as its hostname: torch 1.13's agent gives its
# ranks MASTER_ADDR = rank 0's getfqdn(), and the nodes share this machine's
# /etc/hosts, where the hostname is loopback. A real cluster resolves its
# hostnames; dslaunch needs neither, as its ranks get node 0's address.);
# over "pods" tests/pods/pods.sh pods (needs root): dslaunch in the
# launcher pod with --launcher join and a dsagent in each worker pod, one
# torchrun agent in each worker pod (c10d store on pod 0's agent,
# GLOO_SOCKET_IFNAME=eth0; every pod's /etc/hosts names every worker pod,
# standing in for the cluster DNS of a headless Service, which torch's
# agent needs for MASTER_ADDR = rank 0's host name). No pod is restarted:
# both restart the ranks on the agents they have.
#
# usage: bench/restart.sh [--runs N] [--quick] [--shapes "3x2 8x2"]
#                         [--over "local ssh"]
#   --runs N    measured runs per launcher and shape (default 5)
#   --quick     2 runs
#   --shapes S  the shapes, blank-separated
#   --over W    where the nodes are: local, ssh, pods, blank-separated
#               (default "local ssh pods"; ssh and pods are left out, with a
#               note, when not root)
# env: DSLAUNCH_BUILD   build directory holding bin/dslaunch (default
#                       <script dir>/../build)
#      BENCH_PYTHON     a Python with torch (default /usr/bin/python3,
#                       Debian's python3-torch)
#      BENCH_RUN_TIMEOUT_S  a run that takes longer is killed and counted as
#                       failed (120)
#
# The program is bench/restart_rank.py. In generation 0 the last rank exits
# 1 once every rank started (its time: "fail"); the launcher stops the
# others and starts generation 1, whose ranks write their start time first
# thing, then join a Gloo process group at the MASTER_ADDR:MASTER_PORT the
# launcher gave, pass a barrier and write the time (their first step after
# the resume). Per run:
#   running   = (latest start of a generation-1 rank) - fail
#   progress  = (latest post-barrier time of a generation-1 rank) - fail
# Both launchers run every rank with the same Python, so the import of
# torch.distributed (about a second of CPU per rank here) is in both
# progress numbers alike. dslaunch runs with --restart_backoff 0 (its
# default, 1 s, waits on purpose); torchrun once with its default
# --monitor_interval (5 s) and once with 0.1 s, the fastest it polls.
set -euo pipefail

SCRIPT_DIR=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=bench/lib.sh
. "$SCRIPT_DIR/lib.sh"

usage() { sed -n '2,26p' "$0" | sed 's/^# \{0,1\}//'; }

RUNS=5
SHAPES=(3x2 8x2)
OVER=(local ssh pods)
while (($#)); do
  case "$1" in
    --runs) need_positive_int --runs "${2-}"; RUNS=$2; shift 2 ;;
    --runs=*) RUNS=${1#--runs=}; need_positive_int --runs "$RUNS"; shift ;;
    --quick) RUNS=2; shift ;;
    --shapes) read -r -a SHAPES <<<"${2-}"; shift 2 ;;
    --over) read -r -a OVER <<<"${2-}"; shift 2 ;;
    -h|--help) usage; exit 0 ;;
    *) echo "unknown argument: $1" >&2; usage >&2; exit 2 ;;
  esac
done
for shape in "${SHAPES[@]}"; do
  [[ $shape =~ ^[1-9][0-9]*x[1-9][0-9]*$ ]] || { echo "bad shape: $shape" >&2; exit 2; }
done
for where in "${OVER[@]}"; do
  [[ $where == local || $where == ssh || $where == pods ]] ||
    { echo "bad --over: $where" >&2; exit 2; }
done
if [[ " ${OVER[*]} " != " local " && $(id -u) -ne 0 ]]; then
  echo "note: --over ssh and pods need root (network namespaces); measuring local only" >&2
  OVER=(local)
fi

BUILD=${DSLAUNCH_BUILD:-$SCRIPT_DIR/../build}
DSLAUNCH=$BUILD/bin/dslaunch
need_build_bins "$BUILD"
PY=${BENCH_PYTHON:-/usr/bin/python3}
"$PY" -c "import torch.distributed" 2>/dev/null ||
  { echo "$PY cannot import torch.distributed (apt-get install python3-torch)" >&2; exit 2; }
RANK_PY=$SCRIPT_DIR/restart_rank.py
RUN_TIMEOUT_S=${BENCH_RUN_TIMEOUT_S:-120}
need_cc
bench_init restart
build_helper

PODS_SH=$SCRIPT_DIR/../tests/pods/pods.sh
PODS_DIR=""
bench_cleanup_more() {   # after the tagged processes are reaped
  pods_down
}
pods_down() {
  if [[ -n "$PODS_DIR" ]]; then
    "$PODS_SH" down "$PODS_DIR" >/dev/null || echo "warning: pods.sh down $PODS_DIR failed" >&2
    PODS_DIR=""
  fi
}
# pods_up N: N worker pods, each pod's /etc/hosts naming them all
pods_up() {
  local n=$1 rc=0 i j net
  pods_down
  PODS_DIR=$WORK/p$n
  chmod 0755 "$WORK"  # the pods' UIDs reach the secret and binaries in it
  mkdir -p "$WORK/bin"
  cp "$BUILD/bin/dslaunch" "$BUILD/bin/dsagent" "$WORK/bin/"
  PODS_BIN=$WORK/bin "$PODS_SH" up "$n" "$PODS_DIR" >"$WORK/up.log" 2>&1 || rc=$?
  if ((rc != 0)); then
    cat "$WORK/up.log" >&2
    PODS_DIR=""
    echo "pods.sh up $n failed (exit $rc)" >&2
    exit "$rc"
  fi
  set -a
  # shellcheck disable=SC1091
  . "$PODS_DIR/env"
  set +a
  net=${PODS_LAUNCHER_ADDR%.*}
  for ((i = 0; i < n; i++)); do
    for ((j = 0; j < n; j++)); do
      ((i == j)) || echo "$net.$((j + 1)) train-worker-$j"
    done >>"$PODS_DIR/pod-$i/hosts"  # the bind-mounted file: same inode
  done
  # The pods' UIDs read the program and write the stamps.
  cp "$RANK_PY" "$PODS_VOLUME/restart_rank.py"
}

free_port() {
  "$PY" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

# run_dslaunch WHERE NODES PER DIR LOG -> exit status
run_dslaunch() {
  local where=$1 nodes=$2 per=$3 dir=$4 log=$5 hf=$4/hostfile i rc=0 pids=()
  local how=(--launcher local)
  if [[ $where == pods ]]; then
    for ((i = 0; i < nodes; i++)); do
      "$PODS_SH" run "$PODS_DIR" "$i" -e "$TAG" -- "$PODS_BIN/dsagent" \
        --join "$PODS_LAUNCHER:29400" --secret_file "$PODS_SECRET" </dev/null >>"$log" 2>&1 &
      pids+=($!)
    done
    timeout "$RUN_TIMEOUT_S" "$PODS_SH" run "$PODS_DIR" launcher -e "$TAG" -- \
      "$PODS_BIN/dslaunch" --launcher join --num_nodes "$nodes" --num_gpus "$per" \
      --secret_file "$PODS_SECRET" --no_local_rank --env "BENCH_DIR=$dir" \
      --env OMP_NUM_THREADS=1 --max_restarts 1 --restart_backoff 0 --console lines \
      "$PY" -u "$PODS_VOLUME/restart_rank.py" </dev/null >>"$log" 2>&1 || rc=$?
    for i in "${pids[@]}"; do wait "$i" || true; done
    return "$rc"
  fi
  if [[ $where == ssh ]]; then
    hf=$CLUSTER_HOSTFILE
    how=(--launcher ssh --ssh_identity "$CLUSTER_KEY" --ssh_known_hosts
         "$CLUSTER_KNOWN_HOSTS" --ssh_user root --env "BENCH_DIR=$dir"
         --env "$TAG" --env OMP_NUM_THREADS=1)
  else
    for ((i = 1; i <= nodes; i++)); do echo "127.0.0.$i slots=$per"; done >"$hf"
  fi
  env "$TAG" BENCH_DIR="$dir" OMP_NUM_THREADS=1 timeout "$RUN_TIMEOUT_S" \
    "$DSLAUNCH" --hostfile "$hf" "${how[@]}" --no_local_rank \
    --max_restarts 1 --restart_backoff 0 --console lines \
    "$PY" -u "$RANK_PY" >"$log" 2>&1
}

# run_torchrun WHERE NODES PER DIR LOG MONITOR_S -> exit status (the first
# non-zero)
run_torchrun() {
  local where=$1 nodes=$2 per=$3 dir=$4 log=$5 monitor=$6 port i rc=0 status id
  local pids=() host=127.0.0.1 in=() conf=() prog=""
  [[ $where == pods ]] && prog=$PODS_VOLUME/restart_rank.py
  port=$(free_port)
  [[ $where == ssh ]] && host=${NODES[0]}
  [[ $where == pods ]] && host=${PODS_LAUNCHER_ADDR%.*}.1 && port=29500
  id=bench.$RANDOM.$RANDOM  # one rendezvous for every agent of the run
  for ((i = 0; i < nodes; i++)); do
    if [[ $where == pods ]]; then
      in=("$PODS_SH" run "$PODS_DIR" "$i" -e "$TAG" -e "BENCH_DIR=$dir" -e OMP_NUM_THREADS=1
          -e GLOO_SOCKET_IFNAME=eth0 --)
      conf=(--rdzv_conf "is_host=$((i == 0 ? 1 : 0))")
    elif [[ $where == ssh ]]; then
      in=("$CLUSTER_SH" exec "$CLUSTER_DIR" "$((i + 1))" unshare --uts
          sh -c 'hostname "$0" && exec "$@"' "${NODES[i]}" env GLOO_SOCKET_IFNAME=eth0)
      conf=(--rdzv_conf "is_host=$((i == 0 ? 1 : 0))")
    fi
    env "$TAG" BENCH_DIR="$dir" OMP_NUM_THREADS=1 timeout "$RUN_TIMEOUT_S" \
      "${in[@]}" "$PY" -m torch.distributed.run --nnodes "$nodes" --nproc_per_node "$per" \
      --rdzv_backend c10d --rdzv_endpoint "$host:$port" --rdzv_id "$id" "${conf[@]}" \
      --max_restarts 1 --monitor_interval "$monitor" --redirects 1 --tee 1 \
      "${prog:-$RANK_PY}" </dev/null >>"$log" 2>&1 &
    pids+=($!)
  done
  for i in "${pids[@]}"; do
    status=0
    wait "$i" || status=$?
    [[ $rc -ne 0 ]] || rc=$status
  done
  return "$rc"
}

# measure DIR NRANKS -> "running_ns progress_ns", or fails
measure() {
  local dir=$1 n=$2 fail running progress
  [[ -f $dir/fail ]] || return 1
  (($(ls "$dir" | grep -c '^start\.1\.') == n)) || return 1
  (($(ls "$dir" | grep -c '^progress\.') == n)) || return 1
  fail=$(cat "$dir/fail")
  running=$(cat "$dir"/start.1.* | sort -n | tail -1)
  progress=$(cat "$dir"/progress.* | sort -n | tail -1)
  echo "$((running - fail)) $((progress - fail))"
}

LAUNCHERS=("dslaunch" "torchrun (monitor 5 s)" "torchrun (monitor 0.1 s)")
declare -A RUNNING PROGRESS
echo "# $(machine_line)"
echo "# $RUNS runs per launcher, shape and placement; times from the failing rank's exit"
for where in "${OVER[@]}"; do
  for shape in "${SHAPES[@]}"; do
    nodes=${shape%x*}
    per=${shape#*x}
    n=$((nodes * per))
    [[ $where == ssh ]] && SLOTS=$per bench_cluster_up "$nodes"
    [[ $where == pods ]] && pods_up "$nodes"
    for ((run = 0; run < RUNS; run++)); do
      for launcher in "${LAUNCHERS[@]}"; do
        key=$where.$shape.$launcher
        dir=$WORK/$where.$shape.$run.${launcher//[^a-z0-9.]/_}
        [[ $where == pods ]] && dir=$PODS_VOLUME/$shape.$run.${launcher//[^a-z0-9.]/_}
        log=$WORK/$where.$shape.$run.${launcher//[^a-z0-9.]/_}.log
        mkdir -p "$dir"
        [[ $where != pods ]] || chmod 0777 "$dir"  # the pods' UIDs write there
        status=0
        case $launcher in
          dslaunch) run_dslaunch "$where" "$nodes" "$per" "$dir" "$log" || status=$? ;;
          "torchrun (monitor 5 s)")
            run_torchrun "$where" "$nodes" "$per" "$dir" "$log" 5 || status=$? ;;
          *) run_torchrun "$where" "$nodes" "$per" "$dir" "$log" 0.1 || status=$? ;;
        esac
        "$HELPER" reap "$TAG" KILL >/dev/null 2>&1 || true
        if [[ $status -ne 0 ]] || ! m=$(measure "$dir" "$n"); then
          error "$launcher $where $shape run $run: exit $status; output:"
          tail -n 12 "$log" | sed 's/^/    /' >&2
          continue
        fi
        read -r r p <<<"$m"
        RUNNING[$key]+="$r "
        PROGRESS[$key]+="$p "
      done
    done
    [[ $where == ssh ]] && bench_cluster_down
    [[ $where == pods ]] && pods_down
  done
done

printf '\n%-26s %-6s %-6s %18s %14s %18s %14s\n' launcher over shape "running (median)" \
  range "progress (median)" range
for where in "${OVER[@]}"; do
  for shape in "${SHAPES[@]}"; do
    for launcher in "${LAUNCHERS[@]}"; do
      r=${RUNNING[$where.$shape.$launcher]-}
      p=${PROGRESS[$where.$shape.$launcher]-}
      printf '%-26s %-6s %-6s %15s ms %14s %15s ms %14s\n' "$launcher" "$where" "$shape" \
        "$(tr ' ' '\n' <<<"$r" | grep . | median_ms)" "$(tr ' ' '\n' <<<"$r" | grep . | range_ms)" \
        "$(tr ' ' '\n' <<<"$p" | grep . | median_ms)" "$(tr ' ' '\n' <<<"$p" | grep . | range_ms)"
    done
  done
done
exit_on_errors
