#!/usr/bin/env bash
# Worker pods simulated on this machine as Kubernetes/OpenShift makes them, for
# `dslaunch --launcher join` (see README.md): per pod a network namespace on a
# bridge, a UTS namespace (hostname train-worker-I), a mount namespace with a
# read-only / and a private writable TMPDIR, a non-root UID without a passwd
# entry (GID 0), the environment a pod gets, and no sshd.
#
#   pods.sh up N DIR                   N worker pods 0..N-1 and a launcher pod, state in DIR (created)
#   pods.sh run DIR POD [OPTS] [--] CMD...  run CMD in POD (0..N-1 or "launcher") as the platform would
#   pods.sh argv DIR POD [OPTS] [--] CMD...  run's command line, NUL-separated (to fork it yourself)
#   pods.sh pids DIR POD               pids in POD's network namespace, its pause process left out
#   pods.sh status DIR                 one line per pod (exit 1 if one is not up)
#   pods.sh down DIR                   stop everything recorded in DIR, remove DIR
#
# run OPTS: --uid U (default: 100000+I; the launcher pod 100999), --index K
# (JOB_COMPLETION_INDEX=K; default: I, an Indexed Job's), --no-index (no
# JOB_COMPLETION_INDEX: a StatefulSet's pod), -e K=V (one more variable).
# Env knobs for up: PODS_BIN (copy dslaunch, dsagent, dsworker from there into
# DIR/bin, mode 0755), PODS_NAME (hostname prefix, default train-worker).
#
# Exit 77 when the machine cannot host pods (not root, no namespaces), so that
# callers can skip.
set -euo pipefail

PROG=${0##*/}
LOCK_FILE=/run/lock/dslaunch-pods.lock
MARKER=.dslaunch-pods
UID_BASE=100000
LAUNCHER_UID=100999
LAUNCHER_HOST=250 # the launcher pod's address: 10.214.X.250; worker pod I: 10.214.X.(I+1)
SKIP=77
# die, warn, skip, check_dir_name, ns_exists, link_exists, alive, wait_gone,
# remove_network, empty_namespace, cmdline_of, down_dir, open_forward
. "$(dirname "${BASH_SOURCE[0]}")/../common/netns.sh"
POD_PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin

usage() {
  { echo "usage:" && sed -n '8,13p' "$0" | sed 's/^#//'; } >&2
  exit 2
}

need_root() {
  [[ $(id -u) -eq 0 ]] || skip "needs root (network, UTS and mount namespaces, a bridge); run as root"
}

need_tools() {
  local t missing=()
  for t in ip nsenter unshare setpriv setsid flock openssl; do
    command -v "$t" >/dev/null 2>&1 || missing+=("$t")
  done
  ((${#missing[@]} == 0)) || skip "missing ${missing[*]} (apt-get install -y iproute2 util-linux openssl)"
  unshare --net --uts --mount true 2>/dev/null || skip "cannot create namespaces here (no CAP_SYS_ADMIN?)"
}

# DIR goes unquoted into mount arguments and the pause's command line.

# ---------------------------------------------------------------- state
# DIR/state is an intent log: a line is written *before* the thing it names is
# made, so that `down` undoes a half-finished `up`. Lines:
#   tag T | x X | n N | bridge B | iptables B | pod I NS VETH (I: 0.. or L) | pause I PID
record() { echo "$*" >>"$DIR/state"; }

load_state() {
  TAG='' X='' N=0 BRIDGE='' IPT=''
  POD_NS=() POD_VETH=() PAUSE=()
  [[ -f $DIR/state ]] || return 0
  local k a b c
  while read -r k a b c; do
    case $k in
      tag) TAG=$a ;;
      x) X=$a ;;
      n) N=$a ;;
      bridge) BRIDGE=$a ;;
      iptables) IPT=$a ;;
      pod) POD_NS[$(slot "$a")]=$b POD_VETH[$(slot "$a")]=$c ;;
      pause) PAUSE[$(slot "$a")]=$b ;;
    esac
  done <"$DIR/state"
}

# A pod's name (0.. or L) -> its index in the state arrays (the launcher: 1000).
slot() { if [[ $1 == L ]]; then echo 1000; else echo "$1"; fi; }

open_dir() {
  check_dir_name "$1"
  [[ -f $1/$MARKER ]] || die "$1 is not a pods directory (no $MARKER)"
  DIR=$(cd "$1" && pwd -P)
  load_state
  [[ -n $TAG ]] || die "$DIR: pods state is empty"
}

pod_arg() { # POD -> P (0.. or L), checked against DIR's state
  case $1 in
    launcher | L) P=L ;;
    *)
      if ! [[ $1 =~ ^[0-9]+$ ]] || (($1 >= N)); then
        die "no pod '$1' in $DIR (pods 0..$((N - 1)), launcher)"
      fi
      P=$1
      ;;
  esac
}


# pid of pod P's pause process, if it is alive, in P's network namespace, and asleep
pause_pid() {
  local pid=${PAUSE[$(slot "$1")]:-}
  [[ -n $pid ]] && alive "$pid" || return 1
  [[ $(cat "/proc/$pid/comm" 2>/dev/null) == sleep ]] || return 1
  [[ $(ip netns identify "$pid" 2>/dev/null) == "${POD_NS[$(slot "$1")]}" ]] || return 1
  echo "$pid"
}


# ---------------------------------------------------------------- teardown
teardown() {
  load_state
  local s
  # every process in a pod's network namespace (the job's, then the pause)
  for s in "${!POD_NS[@]}"; do
    empty_namespace "${POD_NS[s]}" "${POD_NS[s]}" quiet
  done
  remove_network "$IPT" "$BRIDGE" -- "${POD_VETH[@]}" -- "${POD_NS[@]}"
  rm -rf -- "$DIR"
}

cmd_down() {
  [[ $# -eq 1 ]] || usage
  down_dir pods "$1"
}

# ---------------------------------------------------------------- up
UP_DONE=0
on_up_exit() {
  local rc=$?
  if ((rc != 0 && UP_DONE == 0)) && [[ -n ${DIR:-} && -f $DIR/$MARKER ]]; then
    echo "$PROG: up failed (exit $rc); tearing down what was built" >&2
    teardown || true
  fi
  exit "$rc"
}

# A free tag (bridge dslp<hex>, namespaces dslp<hex>p<I>) under a machine-wide
# lock, claimed by making the bridge. The pods' subnet 10.214.X.0/24 lives on
# that bridge only (no address in this namespace, no route out of a pod), so
# two pod sets never see each other whatever their X.
allocate_and_make_bridge() {
  local h k hh lockfd
  h=$((16#$(printf '%s' "$DIR" | sha1sum | cut -c1-4)))
  mkdir -p "${LOCK_FILE%/*}"
  exec {lockfd}>"$LOCK_FILE"
  flock -w 60 "$lockfd" || die "could not take $LOCK_FILE"
  for ((k = 0; k < 250; k++)); do
    hh=$(((h + k * 257) % 65536))
    TAG=$(printf 'dslp%04x' "$hh")
    link_exists "${TAG}br" || compgen -G "/run/netns/${TAG}p*" >/dev/null || break
    TAG=''
  done
  [[ -n $TAG ]] || die "no free pods tag"
  X=$((hh % 250 + 1))
  BRIDGE=${TAG}br
  record "tag $TAG"
  record "x $X"
  record "bridge $BRIDGE"
  ip link add name "$BRIDGE" type bridge stp_state 0 forward_delay 0
  ip link set dev "$BRIDGE" up
  flock -u "$lockfd"
  exec {lockfd}>&-
}


pod_addr() { if [[ $1 == L ]]; then echo "10.214.$X.$LAUNCHER_HOST"; else echo "10.214.$X.$(($1 + 1))"; fi; }
pod_host() { if [[ $1 == L ]]; then echo train-launcher; else echo "${PODS_NAME:-train-worker}-$1"; fi; }
pod_uid() { if [[ $1 == L ]]; then echo "$LAUNCHER_UID"; else echo $((UID_BASE + $1)); fi; }

# The pod's files: DIR/pod-P/tmp (its TMPDIR, an emptyDir: its UID's, 0700),
# DIR/pod-P/hosts (its /etc/hosts as the kubelet writes it, plus the
# launcher's Service name, standing in for cluster DNS).
write_pod_files() { # P
  local p=$1 d=$DIR/pod-$1
  mkdir -p "$d/tmp"
  chown "$(pod_uid "$p"):0" "$d/tmp"
  chmod 0700 "$d/tmp"
  {
    echo "127.0.0.1 localhost"
    echo "$(pod_addr "$p") $(pod_host "$p")"
    echo "10.214.$X.$LAUNCHER_HOST dslaunch-launcher"
  } >"$d/hosts"
}

# Namespaces of pod P: the network namespace on the bridge, and a pause
# process holding its UTS and mount namespaces (Kubernetes' pause container):
# hostname, / read-only, TMPDIR, DIR/volume, its own /dev/shm, /etc/hosts and
# an /etc/resolv.conf without a nameserver writable or bound. `run` enters them.
make_pod() { # P
  local p=$1 s ns veth d=$DIR/pod-$1
  s=$(slot "$p")
  ns=${TAG}p$p veth=${TAG}v$p
  [[ $p != L ]] || ns=${TAG}pl veth=${TAG}vl
  record "pod $p $ns $veth"
  ip netns add "$ns"
  ip link add name "$veth" type veth peer name eth0 netns "$ns"
  ip link set dev "$veth" master "$BRIDGE" up
  ip -n "$ns" link set dev lo up
  ip -n "$ns" addr add "$(pod_addr "$p")/24" dev eth0
  ip -n "$ns" link set dev eth0 up
  POD_NS[s]=$ns POD_VETH[s]=$veth
  write_pod_files "$p"
  # shellcheck disable=SC2016
  nsenter --net="/run/netns/$ns" unshare --uts --mount --propagation private -- \
    setsid /bin/sh -ec '
      hostname "$1"
      mount --bind "$2/tmp" "$2/tmp"
      mount --bind "$3/volume" "$3/volume"
      mount -t tmpfs -o size=64m,mode=1777,nosuid,nodev tmpfs /dev/shm
      mount --bind "$2/hosts" /etc/hosts
      mount --bind "$3/resolv.conf" /etc/resolv.conf
      mount -o remount,bind,ro /
      exec sleep infinity' pause "$(pod_host "$p")" "$d" "$DIR" \
    </dev/null >>"$d/pause.log" 2>&1 &
  record "pause $p $!"
  PAUSE[s]=$!
}

wait_pods() { # every pause asleep within 10 s
  local s p end=$((SECONDS + 10))
  for s in "${!POD_NS[@]}"; do
    p=$s
    ((s != 1000)) || p=L
    until pause_pid "$p" >/dev/null; do
      if ! alive "${PAUSE[s]}" || ((SECONDS >= end)); then
        die "pod $p did not come up: $(cat "$DIR/pod-$p/pause.log" 2>/dev/null)"
      fi
      sleep 0.02
    done
  done
}

cmd_up() {
  [[ $# -eq 2 ]] || usage
  local n=$1 i b
  need_root
  need_tools
  if ! [[ $n =~ ^[0-9]+$ ]] || ((n < 1 || n > 200)); then die "N must be 1..200, got '$n'"; fi
  check_dir_name "$2"
  if [[ -e $2 ]]; then
    [[ -d $2 && -z $(ls -A "$2") ]] || die "$2 exists and is not an empty directory"
  fi
  mkdir -p "$2"
  DIR=$(cd "$2" && pwd -P)
  check_dir_name "$DIR"
  : >"$DIR/$MARKER"
  trap on_up_exit EXIT
  trap 'exit 130' INT
  trap 'exit 143' TERM
  N=$n POD_NS=() POD_VETH=() PAUSE=()
  # Every UID reaches DIR (group 0 reads the secret and writes the volume);
  # each pod's TMPDIR is its own.
  chmod 0755 "$DIR"
  mkdir -m 0755 "$DIR/bin"
  mkdir "$DIR/volume"
  chmod 0770 "$DIR/volume"
  printf '# no cluster DNS in these pods: names resolve through /etc/hosts\noptions timeout:1 attempts:1\n' \
    >"$DIR/resolv.conf"
  (umask 0337 && openssl rand -hex 32 >"$DIR/secret")
  if [[ -n ${PODS_BIN:-} ]]; then
    for b in dslaunch dsagent dsworker; do
      if [[ -f $PODS_BIN/$b ]]; then install -m 0755 "$PODS_BIN/$b" "$DIR/bin/$b"; fi
    done
    # a copy taken while the build was writing it would not run
    for b in dslaunch dsagent; do
      "$DIR/bin/$b" --version >/dev/null || die "$DIR/bin/$b --version failed"
    done
  fi
  setpriv --reuid "$UID_BASE" --regid 0 --clear-groups test -r "$DIR/secret" ||
    die "$DIR/secret is not readable by UID $UID_BASE, GID 0 (is a parent of DIR mode 0700?)"
  allocate_and_make_bridge
  record "n $N"
  open_forward
  make_pod L
  for ((i = 0; i < N; i++)); do make_pod "$i"; done
  wait_pods
  UP_DONE=1
  cat >"$DIR/env" <<EOF
PODS_DIR="$DIR"
PODS_TAG="$TAG"
PODS_N="$N"
PODS_LAUNCHER="dslaunch-launcher"
PODS_LAUNCHER_ADDR="$(pod_addr L)"
PODS_SECRET="$DIR/secret"
PODS_VOLUME="$DIR/volume"
PODS_BIN="$DIR/bin"
EOF
  cat "$DIR/env"
}

# ---------------------------------------------------------------- run
# CMD in pod P: its namespaces (entered, so CMD's pid is this process's: every
# step execs), as its UID with GID 0 and no supplementary groups, no
# capabilities, no_new_privs, in / with the pod's environment only.
# Sets ARGV to that command line.
pod_argv() { # DIR POD [OPTS] [--] CMD...
  [[ $# -ge 3 ]] || usage
  open_dir "$1"
  pod_arg "$2"
  shift 2
  local uid index='' pid envs=() tmp
  uid=$(pod_uid "$P")
  [[ $P == L ]] || index=$P
  while (($#)); do
    case $1 in
      --uid) uid=$2 && shift 2 ;;
      --index) index=$2 && shift 2 ;;
      --no-index) index='' && shift ;;
      -e) envs+=("$2") && shift 2 ;;
      --) shift && break ;;
      *) break ;;
    esac
  done
  (($#)) || usage
  [[ $uid =~ ^[0-9]+$ ]] || die "--uid needs a number"
  pid=$(pause_pid "$P") || die "pod $P is not running"
  tmp=$DIR/pod-$P/tmp
  [[ -z $index ]] || envs=("JOB_COMPLETION_INDEX=$index" "${envs[@]}")
  ARGV=(nsenter --target "$pid" --net --uts --mount --
    setpriv --reuid "$uid" --regid 0 --clear-groups --inh-caps=-all --bounding-set=-all
    --no-new-privs -- env -i -C / PATH="$POD_PATH" HOSTNAME="$(pod_host "$P")"
    KUBERNETES_SERVICE_HOST=10.96.0.1 KUBERNETES_SERVICE_PORT=443
    KUBERNETES_PORT=tcp://10.96.0.1:443 TMPDIR="$tmp" "${envs[@]}" "$@")
}

cmd_run() {
  need_root
  pod_argv "$@"
  exec "${ARGV[@]}"
}

# `run`'s command line, each word NUL-terminated, for a caller that forks it
# itself (bench/join.sh: no bash start-up in what it times).
cmd_argv() {
  need_root
  pod_argv "$@"
  printf '%s\0' "${ARGV[@]}"
}

cmd_pids() {
  [[ $# -eq 2 ]] || usage
  need_root
  open_dir "$1"
  pod_arg "$2"
  local s pause ns
  s=$(slot "$P")
  ns=${POD_NS[s]}
  ns_exists "$ns" || die "pod $P: namespace $ns does not exist"
  pause=${PAUSE[s]:-}
  ip netns pids "$ns" | { grep -vx "$pause" || true; }
}

cmd_status() {
  [[ $# -eq 1 ]] || usage
  need_root
  open_dir "$1"
  local s p ok=0 pid
  echo "pods $TAG  dir $DIR  subnet 10.214.$X.0/24  bridge $BRIDGE  pods $N + launcher"
  for s in "${!POD_NS[@]}"; do
    p=$s
    ((s != 1000)) || p=L
    if pid=$(pause_pid "$p"); then
      echo "pod $p  $(pod_host "$p")  $(pod_addr "$p")  ns ${POD_NS[s]}  uid $(pod_uid "$p")  pause $pid" \
        " procs $(($(ip netns pids "${POD_NS[s]}" | wc -l) - 1))"
    else
      echo "pod $p  $(pod_host "$p")  not running"
      ok=1
    fi
  done
  return "$ok"
}

main() {
  [[ $# -ge 1 ]] || usage
  local c=$1
  shift
  case $c in
    up) cmd_up "$@" ;;
    run) cmd_run "$@" ;;
    argv) cmd_argv "$@" ;;
    pids) cmd_pids "$@" ;;
    status) cmd_status "$@" ;;
    down) cmd_down "$@" ;;
    *) usage ;;
  esac
}

main "$@"
