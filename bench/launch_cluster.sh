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
#               fork()ed). Each rank is a tiny C program that, first thing in
#               main(), writes clock_gettime(CLOCK_REALTIME) (shared by all
#               namespaces) and its pid to DIR/start.<rank> (DIR is shared too:
#               the nodes differ only in their network namespace).
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

usage() { sed -n '2,21p' "$0" | sed 's/^# \{0,1\}//'; }

RUNS=10
NODES_LIST="1 3 8"
while (($#)); do
  case "$1" in
    --runs) [[ $# -ge 2 && "$2" =~ ^[1-9][0-9]*$ ]] || { echo "--runs needs a positive integer" >&2; exit 2; }
            RUNS=$2; shift 2 ;;
    --runs=*) RUNS=${1#--runs=}; [[ "$RUNS" =~ ^[1-9][0-9]*$ ]] || { echo "--runs needs a positive integer" >&2; exit 2; }
              shift ;;
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

SCRIPT_DIR=$(cd "$(dirname "$0")" && pwd)
REPO=$(cd "$SCRIPT_DIR/.." && pwd)
CLUSTER_SH=$REPO/tests/cluster/cluster.sh
BUILD=${DSLAUNCH_BUILD:-$REPO/build}
for b in "$BUILD/bin/dslaunch" "$BUILD/bin/dsagent"; do
  [[ -x "$b" ]] || { echo "missing $b (build it or set DSLAUNCH_BUILD)" >&2; exit 2; }
done
[[ $(id -u) -eq 0 ]] || { echo "needs root (tests/cluster/cluster.sh builds network namespaces)" >&2; exit 77; }
PDSH=$(command -v pdsh || true)
[[ -n "$PDSH" ]] || { echo "pdsh not found (apt-get install pdsh)" >&2; exit 2; }
CC=${CC:-cc}
command -v "$CC" >/dev/null || { echo "no C compiler ($CC)" >&2; exit 2; }

WORK=$(mktemp -d "${TMPDIR:-/tmp}/launch_cluster.XXXXXX")
TAG="DSLAUNCH_BENCH_TAG=$$.$RANDOM.$RANDOM"   # marks every process of this bench
HELPER=$WORK/benchhelper
CURRENT_PID=""
CLUSTER_DIR=""

cleanup() {
  local rc=$?
  trap - EXIT INT TERM HUP
  if [[ -n "$CURRENT_PID" ]]; then
    kill -TERM "$CURRENT_PID" 2>/dev/null || true
    wait "$CURRENT_PID" 2>/dev/null || true
  fi
  if [[ -x "$HELPER" ]]; then   # pid namespace is shared: this finds ranks on nodes too
    "$HELPER" reap "$TAG" TERM >/dev/null 2>&1 || true
    sleep 0.2
    "$HELPER" reap "$TAG" KILL >/dev/null 2>&1 || true
  fi
  if [[ -n "$CLUSTER_DIR" ]]; then
    "$CLUSTER_SH" down "$CLUSTER_DIR" >/dev/null || echo "warning: cluster.sh down $CLUSTER_DIR failed" >&2
  fi
  rm -rf "$WORK"
  exit "$rc"
}
trap cleanup EXIT
trap 'echo "interrupted" >&2; exit 130' INT
trap 'exit 143' TERM
trap 'exit 129' HUP

# The binaries are copied first: a rebuild while the bench runs must not mix
# versions (dslaunch uses the dsagent next to itself; the nodes share files).
mkdir -p "$WORK/bin"
cp "$BUILD/bin/dslaunch" "$BUILD/bin/dsagent" "$WORK/bin/"
DSLAUNCH=$WORK/bin/dslaunch
BIN_TIME=$(date -u -r "$BUILD/bin/dslaunch" '+%Y-%m-%d %H:%M UTC')

# ---------------------------------------------------------------- helper ---
cat >"$WORK/benchhelper.c" <<'EOF'
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static long long now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return (long long)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static void sleep_ns(long long ns) {
  struct timespec ts = {ns / 1000000000LL, ns % 1000000000LL};
  while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {}
}

static int env_int(const char* name) {
  const char* v = getenv(name);
  return v && *v ? atoi(v) : -1;
}

static void write_file(const char* dir, const char* name, const char* text) {
  char tmp[4096], dst[4096];
  snprintf(tmp, sizeof tmp, "%s/.%s.tmp", dir, name);
  snprintf(dst, sizeof dst, "%s/%s", dir, name);
  FILE* f = fopen(tmp, "w");
  if (!f) { perror(tmp); _exit(3); }
  fputs(text, f);
  fclose(f);
  rename(tmp, dst);  /* readers never see a half-written file */
}

static int count_starts(const char* dir) {
  DIR* d = opendir(dir);
  if (!d) return -1;
  int n = 0;
  struct dirent* e;
  while ((e = readdir(d))) if (strncmp(e->d_name, "start.", 6) == 0) n++;
  closedir(d);
  return n;
}

/* rank DIR SETTLE_MS (RANK and WORLD_SIZE from the environment) */
static int rank_main(char** argv) {
  long long t = now_ns();
  const char* dir = argv[0];
  long long settle_ms = atoll(argv[1]);
  int rank = env_int("RANK");
  int size = env_int("WORLD_SIZE");
  if (rank < 0 || size <= 0) { fprintf(stderr, "benchhelper: no rank env\n"); return 4; }
  char name[64], text[128];
  snprintf(name, sizeof name, "start.%d", rank);
  snprintf(text, sizeof text, "%lld %d\n", t, (int)getpid());
  write_file(dir, name, text);
  if (rank != size - 1) {
    sleep(60);
    return 0;
  }
  long long deadline = t + 30LL * 1000000000LL;
  while (count_starts(dir) < size) {
    if (now_ns() > deadline) { fprintf(stderr, "benchhelper: ranks missing\n"); return 5; }
    sleep_ns(200000);
  }
  sleep_ns(settle_ms * 1000000LL);
  snprintf(text, sizeof text, "%lld\n", now_ns());
  write_file(dir, "exit", text);
  _exit(1);
}

static int alive(int pid) {
  if (kill(pid, 0) != 0) return 0;
  char path[64], buf[512];
  snprintf(path, sizeof path, "/proc/%d/stat", pid);
  FILE* f = fopen(path, "r");
  if (!f) return 0;
  size_t n = fread(buf, 1, sizeof buf - 1, f);
  fclose(f);
  buf[n] = 0;
  char* p = strrchr(buf, ')');
  return !(p && p[1] == ' ' && (p[2] == 'Z' || p[2] == 'X'));
}

static long long read_exit(const char* dir) {
  char path[4096];
  long long t = 0;
  snprintf(path, sizeof path, "%s/exit", dir);
  FILE* f = fopen(path, "r");
  if (f) { if (fscanf(f, "%lld", &t) != 1) t = 0; fclose(f); }
  return t;
}

/* scan the start files: number started, latest start, number still alive */
static void scan_ranks(const char* dir, int nranks, int* started, long long* last, int* live) {
  *started = 0; *last = 0; *live = 0;
  for (int r = 0; r < nranks; r++) {
    char path[4096];
    snprintf(path, sizeof path, "%s/start.%d", dir, r);
    FILE* f = fopen(path, "r");
    if (!f) continue;
    long long ts = 0;
    int rpid = 0;
    if (fscanf(f, "%lld %d", &ts, &rpid) == 2) {
      (*started)++;
      if (ts > *last) *last = ts;
      if (alive(rpid)) (*live)++;
    }
    fclose(f);
  }
}

static void stop_child(pid_t pid, int* status) {
  kill(pid, SIGTERM);
  for (int i = 0; i < 200; i++) {  /* 2 s, then SIGKILL */
    if (waitpid(pid, status, WNOHANG) == pid) return;
    sleep_ns(10000000);
  }
  kill(pid, SIGKILL);
  waitpid(pid, status, 0);
}

/* run DIR NRANKS TIMEOUT_MS CAP_MS CMD...
 * stdout, one line:
 *   OK launch_ns teardown_ns exitcode leftovers
 *   CAPPED launch_ns alive_at_cap alive_after_kill   (CAP_MS > 0: the command
 *          had not exited CAP_MS after the failing rank's exit; it was SIGTERMed)
 *   TIMEOUT ... | INCOMPLETE ... */
static int run_main(char** argv) {
  const char* dir = argv[0];
  int nranks = atoi(argv[1]);
  long long timeout_ms = atoll(argv[2]);
  long long cap_ms = atoll(argv[3]);
  char** cmd = argv + 4;
  long long t0 = now_ns();
  pid_t pid = fork();
  if (pid < 0) { perror("fork"); return 10; }
  if (pid == 0) {
    signal(SIGINT, SIG_DFL);
    execvp(cmd[0], cmd);
    perror(cmd[0]);
    _exit(127);
  }
  int pfd = (int)syscall(SYS_pidfd_open, pid, 0);
  int status = 0, started, live;
  long long t1 = 0, last_start, t_exit = 0;
  long long deadline = t0 + timeout_ms * 1000000LL;
  for (;;) {
    long long now = now_ns();
    long long until = deadline;
    if (cap_ms > 0 && t_exit != 0 && t_exit + cap_ms * 1000000LL < until)
      until = t_exit + cap_ms * 1000000LL;
    if (now >= until) {
      if (now >= deadline) {
        stop_child(pid, &status);
        scan_ranks(dir, nranks, &started, &last_start, &live);
        printf("TIMEOUT started=%d/%d exit_recorded=%d alive=%d\n", started, nranks,
               t_exit != 0, live);
        return 0;
      }
      /* capped: the command is still waiting for ranks on other nodes */
      int live_at_cap, live_after;
      scan_ranks(dir, nranks, &started, &last_start, &live_at_cap);
      stop_child(pid, &status);
      sleep_ns(300000000LL);  /* let ssh sessions close */
      scan_ranks(dir, nranks, &started, &last_start, &live_after);
      if (started < nranks) {
        printf("INCOMPLETE started=%d/%d exit_recorded=1 code=capped leftovers=%d\n",
               started, nranks, live_after);
        return 0;
      }
      printf("CAPPED %lld %d %d\n", last_start - t0, live_at_cap, live_after);
      return 0;
    }
    long long slice_ms = (until - now) / 1000000LL + 1;
    if (cap_ms > 0 && t_exit == 0 && slice_ms > 10) slice_ms = 10;  /* look for the exit file */
    if (pfd >= 0) {
      struct pollfd p = {pfd, POLLIN, 0};
      if (poll(&p, 1, (int)slice_ms) < 0 && errno != EINTR) { perror("poll"); return 10; }
    } else {  /* old kernel: poll waitpid every millisecond */
      sleep_ns(1000000LL);
    }
    if (waitpid(pid, &status, WNOHANG) == pid) { t1 = now_ns(); break; }
    if (cap_ms > 0 && t_exit == 0) t_exit = read_exit(dir);
  }
  scan_ranks(dir, nranks, &started, &last_start, &live);
  t_exit = read_exit(dir);
  int code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  if (started < nranks || t_exit == 0) {
    printf("INCOMPLETE started=%d/%d exit_recorded=%d code=%d leftovers=%d\n",
           started, nranks, t_exit != 0, code, live);
    return 0;
  }
  printf("OK %lld %lld %d %d\n", last_start - t0, t1 - t_exit, code, live);
  return 0;
}

/* reap MARKER SIG: signal every process (but us) whose environment holds
 * MARKER as an entry; print how many were found (zombies not counted) */
static int reap_main(char** argv) {
  const char* marker = argv[0];
  int sig = strcmp(argv[1], "KILL") == 0 ? SIGKILL : strcmp(argv[1], "NONE") == 0 ? 0 : SIGTERM;
  size_t mlen = strlen(marker);
  DIR* d = opendir("/proc");
  if (!d) return 1;
  int found = 0;
  struct dirent* e;
  static char buf[1 << 20];
  while ((e = readdir(d))) {
    int pid = atoi(e->d_name);
    if (pid <= 0 || pid == getpid()) continue;
    char path[64];
    snprintf(path, sizeof path, "/proc/%d/environ", pid);
    int fd = open(path, O_RDONLY);
    if (fd < 0) continue;
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (n <= 0) continue;
    buf[n] = 0;
    for (ssize_t i = 0; i < n; i += strlen(buf + i) + 1) {
      if (strlen(buf + i) == mlen && memcmp(buf + i, marker, mlen) == 0) {
        if (alive(pid)) {
          found++;
          if (sig) kill(pid, sig);
        }
        break;
      }
    }
  }
  closedir(d);
  printf("%d\n", found);
  return 0;
}

int main(int argc, char** argv) {
  if (argc >= 4 && strcmp(argv[1], "rank") == 0) return rank_main(argv + 2);
  if (argc >= 7 && strcmp(argv[1], "run") == 0) return run_main(argv + 2);
  if (argc >= 4 && strcmp(argv[1], "reap") == 0) return reap_main(argv + 2);
  fprintf(stderr, "usage: benchhelper rank DIR SETTLE_MS | run DIR NRANKS TIMEOUT_MS CAP_MS CMD... | reap MARKER TERM|KILL|NONE\n");
  return 2;
}
EOF
"$CC" -O2 -o "$HELPER" "$WORK/benchhelper.c"

# --------------------------------------------------------------- cluster ---
cluster_up() {  # N: builds the cluster, loads its env
  local n=$1
  CLUSTER_DIR=$WORK/c$n
  local rc=0
  "$CLUSTER_SH" up "$n" "$CLUSTER_DIR" >"$WORK/up.log" 2>&1 || rc=$?
  if ((rc != 0)); then
    cat "$WORK/up.log" >&2
    CLUSTER_DIR=""   # a failed up tears itself down
    echo "cluster.sh up $n failed (exit $rc)" >&2
    exit "$rc"
  fi
  set -a
  # shellcheck disable=SC1091
  . "$CLUSTER_DIR/env"
  set +a
  read -r -a NODES <<<"$CLUSTER_NODES"
}

cluster_down() {
  "$CLUSTER_SH" down "$CLUSTER_DIR" >/dev/null
  CLUSTER_DIR=""
}

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
         "$HELPER" rank "$dir" "$SETTLE_MS")
  else
    # per node, like DeepSpeed's launch.py: start SLOTS ranks, wait; when one
    # fails, kill the local siblings and exit with its code (%n = node rank)
    local remote
    remote="export $TAG; cd /; pids=''; for l in \$(seq 0 $((SLOTS - 1))); do"
    remote+=" RANK=\$((%n * $SLOTS + l)) WORLD_SIZE=$world $HELPER rank $dir $SETTLE_MS &"
    remote+=" pids=\"\$pids \$!\"; done;"
    remote+=" for p in \$pids; do wait -n; rc=\$?;"
    remote+=" if [ \$rc -ne 0 ]; then kill \$pids 2>/dev/null; wait; exit \$rc; fi; done; exit 0"
    local hosts
    hosts=$(IFS=,; echo "${NODES[*]}")
    CMD=(env PDSH_RCMD_TYPE=ssh PDSH_SSH_ARGS_APPEND="$CLUSTER_PDSH_SSH_ARGS_APPEND"
         "$PDSH" -S -f 1024 -R ssh -w "$hosts" "$remote")
  fi
}

ERRORS=0
# one_run LAUNCHER -> sets RESULT to "OK launch_ns teardown_ns" or
# "CAPPED launch_ns alive_at_cap alive_after_kill" or ""
one_run() {
  local launcher=$1
  local n=$((CLUSTER_N * SLOTS)) dir=$WORK/run out log line left cap=0
  local what="$launcher ${CLUSTER_N}x$SLOTS"
  rm -rf "$dir"; mkdir -p "$dir"
  log=$WORK/last.$launcher.log
  cmd_for "$launcher" "$dir"
  [[ $launcher == pdsh ]] && cap=$PDSH_CAP_MS
  out=$WORK/result
  env "$TAG" "$HELPER" run "$dir" "$n" "$RUN_TIMEOUT_MS" "$cap" "${CMD[@]}" \
      </dev/null >"$out" 2>"$log" &
  CURRENT_PID=$!
  wait "$CURRENT_PID" || true
  CURRENT_PID=""
  line=$(cat "$out")
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
      echo "ERROR: $what: still on the nodes ${NODE_GRACE_S} s after dslaunch returned (node:pid:comm): $NODE_LEFT" >&2
      ERRORS=$((ERRORS + 1))
    fi
  fi
  kill_everything_on_nodes "$dir" || {
    echo "ERROR: $what: could not clean the nodes: $NODE_LEFT" >&2
    ERRORS=$((ERRORS + 1))
  }
  # anything of this run still alive on this side (launcher, ssh clients)
  left=$("$HELPER" reap "$TAG" KILL)
  case "$line" in
    OK*)
      read -r _ launch teardown code leftovers <<<"$line"
      if [[ $code -ne 1 ]]; then
        echo "ERROR: $what: launcher exited $code, expected 1" >&2
        ERRORS=$((ERRORS + 1))
      fi
      if [[ $leftovers -ne 0 ]]; then
        echo "ERROR: $what: $leftovers rank(s) still alive when the launcher returned" >&2
        ERRORS=$((ERRORS + 1))
      fi
      RESULT="OK $launch $teardown"
      ;;
    CAPPED*)
      if [[ $launcher != pdsh ]]; then
        echo "ERROR: $what: unexpected result $line" >&2
        ERRORS=$((ERRORS + 1))
      else
        RESULT=$line
      fi
      ;;
    *)
      echo "ERROR: $what: run failed: $line; launcher output:" >&2
      tail -n 15 "$log" | sed 's/^/    /' >&2
      ERRORS=$((ERRORS + 1))
      ;;
  esac
  if [[ $left -ne 0 ]]; then
    echo "ERROR: $what: $left tagged process(es) of the run left behind (killed)" >&2
    ERRORS=$((ERRORS + 1))
  fi
  rm -rf "$dir"
}

median_ms() {  # stdin: ns values, one a line
  sort -n | awk '{v[NR] = $1} END {
    if (NR == 0) { print "n/a"; exit }
    m = (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2
    printf "%.1f", m / 1e6 }'
}
range_ms() {  # stdin: ns values -> "min-max"
  sort -n | awk '{v[NR] = $1} END {
    if (NR == 0) { print "n/a"; exit }
    printf "%.0f-%.0f", v[1] / 1e6, v[NR] / 1e6 }'
}
median_int() {  # stdin: integers
  sort -n | awk '{v[NR] = $1} END {
    if (NR == 0) { print "n/a"; exit }
    print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'
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
echo "machine: $(nproc) CPUs ($(grep -m1 'model name' /proc/cpuinfo 2>/dev/null | cut -d: -f2- | sed 's/^ *//')), kernel $(uname -sr), $(awk '/MemTotal/ {printf "%.0f GiB RAM", $2/1048576}' /proc/meminfo)"
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
  cluster_up "$nodes"
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
  cluster_down
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
    NOTE[$nodes]="pdsh still running ${PDSH_CAP_S} s after the failure in $capped/$measured runs; ranks alive then (median): $(median_int <"$WORK/pdsh.atcap") of the $others on other nodes; still alive 0.3 s after pdsh was SIGTERMed: $(median_int <"$WORK/pdsh.afterkill") (killed by the bench)"
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
if ((ERRORS)); then
  echo "ERRORS: $ERRORS (see messages above)" >&2
  exit 1
fi
