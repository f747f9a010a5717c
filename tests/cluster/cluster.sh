#!/usr/bin/env bash
# A real multi-node test cluster on one machine: one network namespace per node,
# joined by a bridge in the root namespace, one sshd per node.  See README.md.
#
#   cluster.sh up N DIR          build N nodes, state in DIR (created)
#   cluster.sh down DIR          tear down everything recorded in DIR, remove DIR
#   cluster.sh status DIR        print what is up (exit 1 if something is not)
#   cluster.sh pids DIR I        pids running in node I's namespace, one per line
#   cluster.sh link DIR I down|up  cut / restore node I's link
#   cluster.sh exec DIR I CMD... run CMD inside node I's namespace
#   cluster.sh login DIR CMD...  run CMD as on the cluster's login node (SLURM)
#
# CLUSTER_SLURM=1: a SLURM cluster too (slurmctld in a namespace of its own,
# a slurmd on every node, one munged); CLUSTER_SSHD=0: no sshd. See README.md.
#
# Exit 77 when the machine cannot host a cluster (not root, no netns, no sshd),
# so that callers can skip.
set -euo pipefail

PROG=${0##*/}
SSHD=${SSHD:-/usr/sbin/sshd}
SLOTS=${SLOTS:-2}
UP_TIMEOUT=${CLUSTER_UP_TIMEOUT:-20}
LOCK_FILE=/run/lock/dslaunch-cluster.lock
MARKER=.dslaunch-cluster
SKIP=77
# die, warn, skip, check_dir_name, ns_exists, link_exists, alive, wait_gone,
# remove_network, empty_namespace, cmdline_of, down_dir, open_forward
. "$(dirname "${BASH_SOURCE[0]}")/../common/netns.sh"


usage() {
  cat >&2 <<EOF
usage: $PROG up N DIR | down DIR | status DIR | pids DIR I | link DIR I down|up | exec DIR I CMD... | login DIR CMD...
EOF
  exit 2
}

need_root() {
  [[ $(id -u) -eq 0 ]] || skip "needs root (network namespaces, bridge, sshd); run as root"
}

need_tools() {
  local t missing=()
  for t in ip ssh ssh-keygen flock timeout "$SSHD"; do
    command -v "$t" >/dev/null 2>&1 || missing+=("$t")
  done
  if ((${#missing[@]})); then
    skip "missing ${missing[*]} (apt-get install -y iproute2 openssh-server openssh-client util-linux coreutils)"
  fi
  unshare --net true 2>/dev/null || skip "cannot create network namespaces here (no CAP_SYS_ADMIN?)"
}

# DIR must be quotable without quoting (check_dir_name): it goes into
# sshd_config, ssh_config and env.

# ---------------------------------------------------------------- state
# DIR/state is an intent log: a line is written *before* the thing it names is
# created, so that `down` can undo a half-finished `up`.  Lines:
#   tag T | x X | n N | uts 0|1 | slurm 0|1 | sshd 0|1 | bridge B |
#   node I NS VETH (node 0: the SLURM controller) | iptables B |
#   daemon PID (munged, slurmctld, slurmd: written once they run)
record() { echo "$*" >>"$DIR/state"; }

load_state() {
  TAG='' X='' N=0 UTS=0 BRIDGE='' IPT='' SLURM=0 SSHD_ON=1
  NODE_NS=() NODE_VETH=() DAEMONS=()
  [[ -f $DIR/state ]] || return 0
  local k a b c
  while read -r k a b c; do
    case $k in
      tag) TAG=$a ;;
      x) X=$a ;;
      n) N=$a ;;
      uts) UTS=$a ;;
      slurm) SLURM=$a ;;
      sshd) SSHD_ON=$a ;;
      daemon) DAEMONS+=("$a") ;;
      bridge) BRIDGE=$a ;;
      iptables) IPT=$a ;;
      node)
        NODE_NS[a]=$b
        NODE_VETH[a]=$c
        ;;
    esac
  done <"$DIR/state"
}

open_dir() { # DIR (must be an existing cluster dir)
  check_dir_name "$1"
  [[ -f $1/$MARKER ]] || die "$1 is not a cluster directory (no $MARKER)"
  DIR=$(cd "$1" && pwd -P)
  load_state
  [[ -n $TAG ]] || die "$DIR: cluster state is empty"
}

node_index() { # I -> validated
  if ! [[ $1 =~ ^[0-9]+$ && -n ${NODE_NS[$1]:-} ]]; then die "no node '$1' in $DIR (nodes 1..$N)"; fi
}


# pid of node I's sshd, if that process is alive and really is in node I's namespace
sshd_pid() {
  local i=$1 pid
  pid=$(cat "$DIR/node$i/sshd.pid" 2>/dev/null) || return 1
  [[ $pid =~ ^[0-9]+$ ]] && alive "$pid" || return 1
  [[ $(ip netns identify "$pid" 2>/dev/null) == "${NODE_NS[i]}" ]] || return 1
  echo "$pid"
}

# ---------------------------------------------------------------- teardown

teardown() { # uses DIR; removes everything recorded in DIR/state, then DIR
  load_state
  local i ns pid pids p desc
  # 0. the SLURM daemons and munged we started (only while the pid is still
  #    the process we started: its command line names DIR)
  pids=()
  for pid in "${DAEMONS[@]}"; do
    if alive "$pid" && tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -qF "$DIR"; then
      kill -TERM "$pid" 2>/dev/null || true
      pids+=("$pid")
    fi
  done
  if ((${#pids[@]})) && ! wait_gone 3 "${pids[@]}"; then
    kill -KILL "${pids[@]}" 2>/dev/null || true
  fi
  # 1. the sshd daemons we started
  pids=()
  for i in "${!NODE_NS[@]}"; do
    if pid=$(sshd_pid "$i"); then
      kill -TERM "$pid" 2>/dev/null || true
      pids+=("$pid")
    fi
  done
  if ((${#pids[@]})) && ! wait_gone 3 "${pids[@]}"; then
    kill -KILL "${pids[@]}" 2>/dev/null || true
  fi
  # 2. anything else still running inside our namespaces: list, TERM, then KILL
  #    (re-listing each round catches children forked meanwhile)
  for i in "${!NODE_NS[@]}"; do
    empty_namespace "${NODE_NS[i]}" "node $i (${NODE_NS[i]})"
  done
  # 3. links and namespaces
  remove_network "$IPT" "$BRIDGE" -- "${NODE_VETH[@]}" -- "${NODE_NS[@]}"
  rm -rf -- "$DIR"
}

cmd_down() {
  [[ $# -eq 1 ]] || usage
  down_dir cluster "$1"
}

# ---------------------------------------------------------------- SLURM
SLURM_GPUS=${CLUSTER_SLURM_GPUS:-2}
SLURM_CPUS=${CLUSTER_SLURM_CPUS:-8}
SLURM_PATH=/usr/sbin:/usr/bin:/sbin:/bin

need_slurm_tools() {
  local t missing=()
  for t in slurmctld slurmd munged srun salloc sbatch scontrol sinfo unshare setsid mknod; do
    command -v "$t" >/dev/null 2>&1 || missing+=("$t")
  done
  if ((${#missing[@]})); then
    skip "missing ${missing[*]} (apt-get install -y slurm-wlm munge)"
  fi
}

node_name() { echo "${TAG}n$1"; }

# DIR/hosts: every node's (and a SLURM cluster's login node's) /etc/hosts.
write_hosts() {
  local i
  {
    echo "127.0.0.1 localhost"
    echo "10.213.$X.253 ${TAG}c"
    echo "10.213.$X.254 ${TAG}login"
    for ((i = 1; i <= N; i++)); do echo "10.213.$X.$i $(node_name "$i")"; done
  } >"$DIR/hosts"
}

# DIR/slurm.conf, DIR/gres.conf and fake GPU device files for SLURM.
write_slurm_config() {
  local i d=$DIR/slurm
  mkdir -p "$d/state" "$d/log" "$d/dev" "$d/munge"
  for ((i = 0; i < SLURM_GPUS; i++)); do mknod "$d/dev/nvidia$i" c 195 "$i"; done
  cat >"$DIR/slurm.conf" <<EOF
# SLURM for test cluster $TAG, written by $PROG
ClusterName=${TAG}
SlurmctldHost=${TAG}c(10.213.$X.253)
SlurmctldPort=6817
SlurmdPort=6818
AuthType=auth/munge
AuthInfo=socket=$d/munge/munge.socket
CredType=cred/munge
SlurmUser=root
SlurmdUser=root
StateSaveLocation=$d/state
SlurmdSpoolDir=$d/spool-%n
SlurmctldPidFile=$d/slurmctld.pid
SlurmdPidFile=$d/slurmd-%n.pid
SlurmctldLogFile=$d/log/slurmctld.log
SlurmdLogFile=$d/log/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SchedulerType=sched/builtin
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SlurmdParameters=config_overrides
ReturnToService=2
MpiDefault=none
GresTypes=gpu
SlurmctldTimeout=10
SlurmdTimeout=10
InactiveLimit=0
MinJobAge=2
KillWait=2
Waittime=0
MessageTimeout=5
EOF
  for ((i = 1; i <= N; i++)); do
    echo "NodeName=$(node_name "$i") NodeAddr=10.213.$X.$i CPUs=$SLURM_CPUS RealMemory=1024 Gres=gpu:$SLURM_GPUS State=UNKNOWN"
  done >>"$DIR/slurm.conf"
  echo "PartitionName=batch Nodes=ALL Default=YES MaxTime=INFINITE State=UP" >>"$DIR/slurm.conf"
  {
    echo "AutoDetect=off"
    echo "NodeName=${TAG}n[1-$N] Name=gpu File=$d/dev/nvidia[0-$((SLURM_GPUS - 1))]"
  } >"$DIR/gres.conf"
}

# CMD with the cluster's SLURM environment only.
slurm_env() {
  env -i PATH="$SLURM_PATH" SLURM_CONF="$DIR/slurm.conf" "$@"
}

# CMD in namespace NS with its own hostname NAME and /etc/hosts (own UTS and
# mount namespaces), in a session of its own, with a clean environment. Run
# it in the background (a subshell): it execs, so $! is CMD's pid.
in_node_view() { # NS NAME CMD...
  local ns=$1 name=$2
  shift 2
  # shellcheck disable=SC2016
  # nsenter, not `ip netns exec`, which mounts a sysfs of the namespace over
  # /sys and so hides /sys/fs/cgroup, without which slurmd will not start.
  exec nsenter --net="/run/netns/$ns" unshare --uts --mount --propagation private -- \
    setsid /bin/sh -c 'hostname "$0" && mount --bind "$1" /etc/hosts && shift && exec "$@"' \
    "$name" "$DIR/hosts" env -i PATH="$SLURM_PATH" SLURM_CONF="$DIR/slurm.conf" "$@"
}

start_slurm() {
  local i d=$DIR/slurm pid
  dd if=/dev/urandom of="$d/munge/munge.key" bs=1024 count=1 status=none
  chmod 0400 "$d/munge/munge.key"
  chmod 0755 "$d/munge"  # the socket is for every user; the key is not
  env -i PATH="$SLURM_PATH" setsid munged --force --foreground --socket="$d/munge/munge.socket" \
    --key-file="$d/munge/munge.key" --pid-file="$d/munge/munged.pid" \
    --log-file="$d/log/munged.log" --seed-file="$d/munge/munge.seed" \
    </dev/null >>"$d/log/munged.out" 2>&1 &
  record "daemon $!"
  make_node 0 253
  in_node_view "${NODE_NS[0]}" "${TAG}c" slurmctld -D -i -f "$DIR/slurm.conf" \
    </dev/null >>"$d/log/slurmctld.out" 2>&1 &
  record "daemon $!"
  for ((i = 1; i <= N; i++)); do
    in_node_view "${NODE_NS[i]}" "$(node_name "$i")" \
      slurmd -D -N "$(node_name "$i")" -f "$DIR/slurm.conf" \
      </dev/null >>"$d/log/slurmd-$i.out" 2>&1 &
    pid=$!
    record "daemon $pid"
    echo "$pid" >"$DIR/node$i.init"
  done
}

# Every node IDLE in sinfo, or die with the daemons' complaints.
wait_slurm() { # deadline
  local end=$1 idle
  while :; do
    idle=$(slurm_env sinfo -h -N -o '%N %t' 2>/dev/null | grep -c ' idle$' || true)
    ((idle == N)) && return 0
    if ((SECONDS >= end)); then
      echo "$PROG: SLURM nodes not idle in time:" >&2
      slurm_env sinfo -N 2>&1 | head -20 >&2 || true
      tail -n 5 "$DIR"/slurm/log/* >&2 2>/dev/null || true
      return 1
    fi
    sleep 0.05
  done
}

# ---------------------------------------------------------------- up
UP_DONE=0
WAITERS=()
on_up_exit() {
  local rc=$?
  if ((${#WAITERS[@]})); then kill "${WAITERS[@]}" 2>/dev/null || true; fi
  if ((rc != 0 && UP_DONE == 0)) && [[ -n ${DIR:-} && -f $DIR/$MARKER ]]; then
    echo "$PROG: up failed (exit $rc); tearing down what was built" >&2
    local f
    for f in "$DIR"/node*/sshd.log; do
      grep -qiE 'fatal|error|cannot|fail|exiting' "$f" 2>/dev/null || continue
      echo "--- ${f#"$DIR"/}:" >&2
      grep -iE 'fatal|error|cannot|fail|exiting' "$f" | tail -n 5 >&2
    done
    teardown || true
  fi
  exit "$rc"
}

subnet_busy() { # X
  ip -4 -o addr show 2>/dev/null | grep -q " 10\.213\.$1\." && return 0
  [[ -n $(ip -4 route show "10.213.$1.0/24" 2>/dev/null) ]]
}

tag_busy() { # TAG
  link_exists "${1}br" && return 0
  compgen -G "/run/netns/${1}n*" >/dev/null
}

# Pick a free tag and subnet (hash of DIR, then probe) and claim them by creating
# the bridge, under a machine-wide lock so that concurrent `up`s never collide.
allocate_and_make_bridge() {
  local h k hh lockfd
  h=$((16#$(printf '%s' "$DIR" | sha1sum | cut -c1-4)))
  mkdir -p "${LOCK_FILE%/*}"
  exec {lockfd}>"$LOCK_FILE"
  flock -w 60 "$lockfd" || die "could not take $LOCK_FILE"
  for ((k = 0; k < 250; k++)); do
    hh=$(((h + k * 257) % 65536)) # 257: moves the tag and X at the same time
    TAG=$(printf 'dslc%04x' "$hh")
    X=$((hh % 250 + 1))
    tag_busy "$TAG" || subnet_busy "$X" || break
    TAG=''
  done
  [[ -n $TAG ]] || die "no free tag/subnet in 10.213.1-250.0/24"
  BRIDGE=${TAG}br
  record "tag $TAG"
  record "x $X"
  record "bridge $BRIDGE"
  ip link add name "$BRIDGE" type bridge stp_state 0 forward_delay 0
  ip addr add "10.213.$X.254/24" dev "$BRIDGE"
  ip link set dev "$BRIDGE" up
  flock -u "$lockfd"
  exec {lockfd}>&-
}


make_node() { # I [HOST] (the address's last byte; default I)
  local i=$1 host=${2:-$1} ns=${TAG}n$1 veth=${TAG}v$1
  record "node $i $ns $veth"
  ip netns add "$ns"
  ip link add name "$veth" type veth peer name eth0 netns "$ns"
  ip link set dev "$veth" master "$BRIDGE" up
  ip -n "$ns" link set dev lo up
  ip -n "$ns" addr add "10.213.$X.$host/24" dev eth0
  ip -n "$ns" link set dev eth0 up
  ip -n "$ns" route add default via "10.213.$X.254"
  NODE_NS[i]=$ns
  NODE_VETH[i]=$veth
}

write_node_sshd() { # I
  local i=$1 d=$DIR/node$1
  mkdir -p "$d"
  ssh-keygen -q -t ed25519 -N '' -C "${TAG}n$i" -f "$d/ssh_host_ed25519_key"
  cat >"$d/sshd_config" <<EOF
# sshd for test-cluster node $i (${TAG}n$i), written by $PROG
ListenAddress 10.213.$X.$i:22
HostKey $d/ssh_host_ed25519_key
PidFile $d/sshd.pid
AuthorizedKeysFile $DIR/authorized_keys
PermitRootLogin prohibit-password
PubkeyAuthentication yes
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
StrictModes no
UseDNS no
MaxStartups 100:30:200
MaxSessions 50
PrintMotd no
PrintLastLog no
X11Forwarding no
Subsystem sftp internal-sftp
LogLevel VERBOSE
EOF
  printf '10.213.%s.%s %s\n' "$X" "$i" "$(cut -d' ' -f1,2 "$d/ssh_host_ed25519_key.pub")" >>"$DIR/known_hosts"
}

start_sshd() { # I
  local i=$1 d=$DIR/node$1 ns=${NODE_NS[$1]}
  if ((UTS)); then
    # own UTS and mount namespaces too: `hostname` on node I says <tag>n<I>,
    # and its /etc/hosts (DIR/hosts) resolves every node's name to its address
    # shellcheck disable=SC2016
    ip netns exec "$ns" unshare --uts --mount --propagation private -- \
      /bin/sh -c 'hostname "$0" && mount --bind "$1" /etc/hosts && shift && exec "$@"' \
      "$(node_name "$i")" "$DIR/hosts" "$SSHD" -f "$d/sshd_config" -E "$d/sshd.log"
  else
    ip netns exec "$ns" "$SSHD" -f "$d/sshd_config" -E "$d/sshd.log"
  fi
}

wait_ssh() { # I deadline
  local i=$1 end=$2 ip=10.213.$X.$1
  while :; do
    if ssh -F "$DIR/ssh_config" -o ConnectTimeout=2 "$ip" true </dev/null >/dev/null 2>&1; then
      return 0
    fi
    # sshd -E logs fatal errors without a "fatal:" prefix; a dead sshd leaves an empty namespace
    if grep -qE 'Cannot bind|exiting' "$DIR/node$i/sshd.log" 2>/dev/null ||
      [[ -z $(ip netns pids "${NODE_NS[i]}") ]] || ((SECONDS >= end)); then
      echo "$PROG: node $i: sshd on $ip does not answer" >&2
      return 1
    fi
    sleep 0.1
  done
}

# node I -> node I+1's sshd through the bridge (bash /dev/tcp, no ping needed)
check_node_to_node() {
  local i j banner
  ((N > 1)) || return 0
  for ((i = 1; i <= N; i++)); do
    j=$((i % N + 1))
    # shellcheck disable=SC2016
    banner=$(ip netns exec "${NODE_NS[i]}" timeout 3 bash -c \
      'exec 3<>"/dev/tcp/$0/22" && head -c 7 <&3' "10.213.$X.$j" 2>/dev/null) || banner=''
    [[ $banner == SSH-2.0 ]] ||
      die "node $i cannot reach node $j (10.213.$X.$j:22) through bridge $BRIDGE" \
        "(a firewall FORWARD chain with br_netfilter may drop bridged traffic)"
  done
}

cmd_up() {
  [[ $# -eq 2 ]] || usage
  local n=$1 i nodes=() nslist=()
  need_root
  SLURM=0 SSHD_ON=1
  if [[ ${CLUSTER_SLURM:-0} == 1 ]]; then SLURM=1; fi
  if [[ ${CLUSTER_SSHD:-1} == 0 ]]; then SSHD_ON=0; fi
  need_tools
  if ((SLURM)); then need_slurm_tools; fi
  if ! [[ $n =~ ^[0-9]+$ ]] || ((n < 1 || n > 252)); then die "N must be 1..252, got '$n'"; fi
  [[ $SLOTS =~ ^[0-9]+$ ]] || die "SLOTS must be a number, got '$SLOTS'"
  check_dir_name "$2"
  if [[ -e $2 ]]; then
    [[ -d $2 ]] || die "$2 exists and is not a directory"
    [[ -z $(ls -A "$2") ]] || die "$2 exists and is not empty (a cluster still up? '$PROG down $2')"
  fi
  mkdir -p "$2"
  DIR=$(cd "$2" && pwd -P)
  check_dir_name "$DIR"
  : >"$DIR/$MARKER"
  trap on_up_exit EXIT
  trap 'exit 130' INT
  trap 'exit 143' TERM
  N=$n
  UTS=0
  if [[ ${CLUSTER_UTS:-0} == 1 ]]; then UTS=1; fi
  NODE_NS=() NODE_VETH=()

  allocate_and_make_bridge
  record "n $N"
  record "uts $UTS"
  record "slurm $SLURM"
  record "sshd $SSHD_ON"
  open_forward
  for ((i = 1; i <= N; i++)); do
    make_node "$i"
    nodes+=("10.213.$X.$i")
    nslist+=("${NODE_NS[i]}")
  done

  ssh-keygen -q -t ed25519 -N '' -C "dslaunch-test-cluster-$TAG" -f "$DIR/id_ed25519"
  cp "$DIR/id_ed25519.pub" "$DIR/authorized_keys"
  : >"$DIR/known_hosts"
  : >"$DIR/hostfile"
  for ((i = 1; i <= N; i++)); do
    write_node_sshd "$i"
    echo "10.213.$X.$i slots=$SLOTS" >>"$DIR/hostfile"
  done
  {
    echo "# ssh -F $DIR/ssh_config 10.213.$X.<i>   (or ${TAG}n<i>)"
    for ((i = 1; i <= N; i++)); do
      printf 'Host %s\n  HostName 10.213.%s.%s\n' "${NODE_NS[i]}" "$X" "$i"
    done
    cat <<EOF
Host *
  User root
  IdentityFile $DIR/id_ed25519
  IdentitiesOnly yes
  UserKnownHostsFile $DIR/known_hosts
  GlobalKnownHostsFile /dev/null
  StrictHostKeyChecking yes
  CheckHostIP no
  BatchMode yes
  ConnectTimeout 5
  LogLevel ERROR
EOF
  } >"$DIR/ssh_config"
  cat >"$DIR/env" <<EOF
CLUSTER_DIR="$DIR"
CLUSTER_TAG="$TAG"
CLUSTER_N="$N"
CLUSTER_SUBNET="10.213.$X.0/24"
CLUSTER_GATEWAY="10.213.$X.254"
CLUSTER_BRIDGE="$BRIDGE"
CLUSTER_NODES="${nodes[*]}"
CLUSTER_NS="${nslist[*]}"
CLUSTER_SLOTS="$SLOTS"
CLUSTER_KEY="$DIR/id_ed25519"
CLUSTER_KNOWN_HOSTS="$DIR/known_hosts"
CLUSTER_HOSTFILE="$DIR/hostfile"
CLUSTER_SSH_CONFIG="$DIR/ssh_config"
CLUSTER_PDSH_SSH_ARGS_APPEND="-F $DIR/ssh_config"
EOF

  local end=$((SECONDS + UP_TIMEOUT)) failed=0 w
  if ((SLURM || UTS)); then
    write_hosts
    echo "CLUSTER_HOSTS=\"$DIR/hosts\"" >>"$DIR/env"
  fi
  if ((SLURM)); then
    write_slurm_config
    local names=()
    for ((i = 1; i <= N; i++)); do names+=("$(node_name "$i")"); done
    cat >>"$DIR/env" <<EOF
CLUSTER_SLURM_CONF="$DIR/slurm.conf"
CLUSTER_NODE_NAMES="${names[*]}"
CLUSTER_CONTROLLER="10.213.$X.253"
EOF
    start_slurm
  fi
  if ((SSHD_ON)); then
    # privilege-separation chroot: the mount namespace is shared, so /run/sshd is too
    mkdir -p /run/sshd
    chmod 0755 /run/sshd
    for ((i = 1; i <= N; i++)); do
      start_sshd "$i" || die "node $i: sshd failed to start"
    done
    for ((i = 1; i <= N; i++)); do
      wait_ssh "$i" "$end" &
      WAITERS+=($!)
    done
    for w in "${WAITERS[@]}"; do wait "$w" || failed=1; done
    WAITERS=()
  fi
  if ((SLURM)) && ! wait_slurm "$end"; then failed=1; fi
  ((failed == 0)) || die "not every node's daemons came up (timeout ${UP_TIMEOUT}s)"
  if ((SSHD_ON)); then check_node_to_node; fi

  UP_DONE=1
  cat "$DIR/env"
}

# ---------------------------------------------------------------- status & helpers
cmd_status() {
  [[ $# -eq 1 ]] || usage
  need_root
  open_dir "$1"
  local i ok=0 st pid nproc
  if [[ -n $BRIDGE ]] && link_exists "$BRIDGE"; then
    st=$(cat "/sys/class/net/$BRIDGE/operstate")
  else
    st=missing
    ok=1
  fi
  echo "cluster $TAG  dir $DIR  subnet 10.213.$X.0/24  bridge $BRIDGE ($st)  nodes $N"
  for ((i = 1; i <= N; i++)); do
    [[ -n ${NODE_NS[i]:-} ]] || {
      echo "node $i  not created"
      ok=1
      continue
    }
    local ns=${NODE_NS[i]} veth=${NODE_VETH[i]} link sshd
    if ! ns_exists "$ns"; then
      echo "node $i  ns $ns missing"
      ok=1
      continue
    fi
    if link_exists "$veth"; then
      link=$(ip -o link show dev "$veth" | grep -q '[<,]UP[,>]' && echo up || echo down)
    else
      link=missing
    fi
    [[ $link == up ]] || ok=1
    if ((!SSHD_ON)); then
      sshd="no sshd"
    elif pid=$(sshd_pid "$i"); then sshd="sshd $pid"; else
      sshd="sshd not running"
      ok=1
    fi
    nproc=$(ip netns pids "$ns" | wc -l)
    echo "node $i  10.213.$X.$i  ns $ns  link $link  $sshd  procs $nproc"
  done
  return "$ok"
}

cmd_pids() {
  [[ $# -eq 2 ]] || usage
  need_root
  open_dir "$1"
  node_index "$2"
  ns_exists "${NODE_NS[$2]}" || die "node $2: namespace ${NODE_NS[$2]} does not exist"
  ip netns pids "${NODE_NS[$2]}"
}

cmd_link() {
  [[ $# -eq 3 ]] || usage
  need_root
  open_dir "$1"
  node_index "$2"
  [[ $3 == up || $3 == down ]] || usage
  # the bridge-side end: the node keeps its address and routes, its NIC just
  # loses carrier, like a pulled cable / dead switch port
  ip link set dev "${NODE_VETH[$2]}" "$3"
}

cmd_exec() {
  [[ $# -ge 3 ]] || usage
  need_root
  open_dir "$1"
  node_index "$2"
  local i=$2 pid
  shift 2
  # A SLURM node: in its slurmd's view (hostname, /etc/hosts), as a step is.
  if ((SLURM)) && pid=$(cat "$DIR/node$i.init" 2>/dev/null) && alive "$pid"; then
    exec ip netns exec "${NODE_NS[i]}" nsenter --uts="/proc/$pid/ns/uts" \
      --mount="/proc/$pid/ns/mnt" -- "$@"
  fi
  if ((UTS)) && pid=$(sshd_pid "$i"); then
    exec ip netns exec "${NODE_NS[i]}" nsenter --uts="/proc/$pid/ns/uts" \
      --mount="/proc/$pid/ns/mnt" -- "$@"
  fi
  exec ip netns exec "${NODE_NS[i]}" "$@"
}

# The login node of a SLURM cluster: this (root) network namespace, hostname
# <tag>login and the cluster's /etc/hosts (own UTS and mount namespaces), and
# SLURM_CONF pointing at the cluster's slurm.conf; the rest of the caller's
# environment stays.
cmd_login() {
  [[ $# -ge 2 ]] || usage
  need_root
  open_dir "$1"
  shift
  ((SLURM)) || die "$DIR is not a SLURM cluster (CLUSTER_SLURM=1 at up)"
  # shellcheck disable=SC2016
  SLURM_CONF="$DIR/slurm.conf" exec unshare --uts --mount --propagation private -- \
    /bin/sh -c 'hostname "$0" && mount --bind "$1" /etc/hosts && shift && exec "$@"' \
    "${TAG}login" "$DIR/hosts" "$@"
}

main() {
  [[ $# -ge 1 ]] || usage
  local c=$1
  shift
  case $c in
    up) cmd_up "$@" ;;
    down) cmd_down "$@" ;;
    status) cmd_status "$@" ;;
    pids) cmd_pids "$@" ;;
    link) cmd_link "$@" ;;
    exec) cmd_exec "$@" ;;
    login) cmd_login "$@" ;;
    -h | --help | help) usage ;;
    *) usage ;;
  esac
}

main "$@"
