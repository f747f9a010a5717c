# Shell helpers shared by the namespace-built test clusters
# (tests/cluster/cluster.sh: SSH and SLURM nodes; tests/pods/pods.sh: pods).
# Sourced; the caller sets PROG (its name in messages) and SKIP (the exit
# status of a skip).

die() {
  echo "$PROG: error: $*" >&2
  exit 1
}
warn() { echo "$PROG: warning: $*" >&2; }
skip() {
  echo "$PROG: skipping: $*" >&2
  exit "$SKIP"
}

# DIR arguments end up in commands and mount options: a safe alphabet only.
check_dir_name() {
  [[ $1 =~ ^[A-Za-z0-9._/@+,:=-]+$ ]] || die "DIR '$1' may only contain [A-Za-z0-9._/@+,:=-]"
}

ns_exists() { [[ -e /run/netns/$1 ]]; }
link_exists() { ip link show dev "$1" >/dev/null 2>&1; }

# Whether pid $1 exists and is not a zombie.
alive() {
  local st
  st=$(cat "/proc/$1/stat" 2>/dev/null) || return 1
  st=${st##*) }
  [[ ${st%% *} != [ZX] ]]
}

# wait_gone TIMEOUT_S PID...: true once none of them is alive.
wait_gone() {
  local t=$1 p left end
  shift
  end=$((SECONDS + t))
  while :; do
    left=()
    for p in "$@"; do if alive "$p"; then left+=("$p"); fi; done
    ((${#left[@]})) || return 0
    ((SECONDS < end)) || return 1
    sleep 0.05
  done
}

# remove_network IPT_TAG BRIDGE VETH... / NETNS...: the links, namespaces,
# forward rule and bridge one suite made (each only if it exists).
# Usage: remove_network "$IPT" "$BRIDGE" -- "${veths[@]}" -- "${namespaces[@]}"
remove_network() {
  local ipt=$1 bridge=$2 x
  shift 3
  while (($#)) && [[ $1 != -- ]]; do
    if link_exists "$1"; then ip link del dev "$1" 2>/dev/null || true; fi
    shift
  done
  shift || true
  for x in "$@"; do
    if ns_exists "$x"; then ip netns del "$x" || warn "could not delete netns $x"; fi
  done
  if [[ -n $ipt ]] && command -v iptables >/dev/null 2>&1; then
    iptables -w -D FORWARD -i "$ipt" -o "$ipt" -j ACCEPT 2>/dev/null || true
  fi
  if [[ -n $bridge ]] && link_exists "$bridge"; then
    ip link del dev "$bridge" || warn "could not delete bridge $bridge"
  fi
}

# A short command line for pid $1 (or [comm]).
cmdline_of() { # pid -> short command line (or [comm])
  local c
  c=$(tr '\0\n' '  ' <"/proc/$1/cmdline" 2>/dev/null | cut -c1-60 | sed 's/[[:space:]]*$//') || true
  [[ -n $c ]] || c="[$(cat "/proc/$1/comm" 2>/dev/null || echo gone)]"
  printf '%s' "$c"
}

# empty_namespace NS LABEL [quiet]: ends every process in network namespace
# NS: TERM, then KILL, re-listing each round to catch children forked
# meanwhile. Unless "quiet", names what it finds first (a leftover, for the
# suites whose own processes were stopped before).
empty_namespace() {
  local ns=$1 label=$2 quiet=${3:-} round sig p pids desc
  for round in 1 2 3 4; do
    ns_exists "$ns" || return 0
    mapfile -t pids < <(ip netns pids "$ns" 2>/dev/null)
    ((${#pids[@]})) || return 0
    if ((round == 1)) && [[ $quiet != quiet ]]; then
      desc=()
      for p in "${pids[@]}"; do desc+=("$p($(cmdline_of "$p"))"); done
      warn "$label: leftover processes, killing: ${desc[*]}"
    fi
    sig=KILL
    ((round > 1)) || sig=TERM
    kill -"$sig" "${pids[@]}" 2>/dev/null || true
    wait_gone 2 "${pids[@]}" || ((round < 4)) || warn "$label: still alive after SIGKILL: ${pids[*]}"
  done
}

# down_dir WHAT DIR: `down` of either suite: DIR checked (MARKER inside, or
# nothing there at all), then the caller's teardown; WHAT names the kind
# ("cluster", "pods") in the messages.
down_dir() {
  local what=$1
  need_root
  check_dir_name "$2"
  if [[ ! -e $2 ]]; then
    echo "$PROG: $2: nothing to tear down"
    return 0
  fi
  [[ -f $2/$MARKER ]] || die "$2 is not a $what directory (no $MARKER); not touching it"
  DIR=$(cd "$2" && pwd -P)
  teardown
  echo "$PROG: $what in $DIR: down"
}

# With br_netfilter, bridged traffic goes through the iptables FORWARD chain,
# which Docker & co. set to DROP: let the suite's $BRIDGE through (recorded
# in its state, so that remove_network takes the rule out again).
open_forward() {
  [[ $(sysctl -n net.bridge.bridge-nf-call-iptables 2>/dev/null || echo 0) == 1 ]] || return 0
  command -v iptables >/dev/null 2>&1 || return 0
  record "iptables $BRIDGE"
  iptables -w -I FORWARD -i "$BRIDGE" -o "$BRIDGE" -j ACCEPT ||
    warn "could not add iptables FORWARD rule for $BRIDGE; traffic between its namespaces may be dropped"
}
