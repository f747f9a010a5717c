#!/usr/bin/env bash
# Launch and tear-down latency of dslaunch (--launcher local) against plain
# OpenMPI mpirun, for job shapes 1x1, 3x2 and 8x4 (nodes x ranks per node),
# all on this one machine.
#
# usage: bench/launch_local.sh [--runs N] [--quick]
#   --runs N   measured runs per launcher and shape (default 20)
#   --quick    5 runs
# env: DSLAUNCH_BUILD  build directory holding bin/dslaunch and bin/dsagent
#                      (default: <script dir>/../build)
#      BENCH_SETTLE_MS pause of the failing rank after all ranks started (20)
#      BENCH_RUN_TIMEOUT_S  a run that takes longer is killed and counted as
#                      failed (30)
#      BENCH_MPIRUN_ARGS extra mpirun arguments, split on blanks (default none:
#                      plain mpirun), e.g. "--mca odls_base_sigkill_timeout 0"
#
# One run measures both numbers:
#   launch    = (latest rank start) - (instant just before the launcher is
#               fork()ed). Each rank is a tiny C program that, first thing in
#               main(), writes clock_gettime(CLOCK_REALTIME) and its pid to
#               DIR/start.<rank>.
#   teardown  = (launcher's waitpid() returned) - (instant the failing rank
#               calls _exit(1)). The last rank (rank = world size - 1) waits
#               until every rank has written its start file, sleeps
#               BENCH_SETTLE_MS, records the time and exits 1; all other ranks
#               sleep 60 s and must be killed by the launcher.
#   Right after the launcher returns, every rank pid is checked (kill -0 and
#   /proc/<pid>/stat not a zombie): a live rank is a leftover and an ERROR.
#   Then any remaining process of the run (found by a marker in its
#   environment: agents, orted, ranks) is reported and killed.
#
# dslaunch gets a hostfile with 127.0.0.1 .. 127.0.0.<nodes>, slots=<ranks per
# node>: every alias is a separate node with its own dsagent. mpirun has no
# such notion: it gets -np <total ranks> --oversubscribe on the one host, which
# is the fair single-machine comparison.
set -euo pipefail

usage() { sed -n '2,15p' "$0" | sed 's/^# \{0,1\}//'; }

RUNS=20
while (($#)); do
  case "$1" in
    --runs) [[ $# -ge 2 && "$2" =~ ^[1-9][0-9]*$ ]] || { echo "--runs needs a positive integer" >&2; exit 2; }
            RUNS=$2; shift 2 ;;
    --runs=*) RUNS=${1#--runs=}; [[ "$RUNS" =~ ^[1-9][0-9]*$ ]] || { echo "--runs needs a positive integer" >&2; exit 2; }
              shift ;;
    --quick) RUNS=5; shift ;;
    -h|--help) usage; exit 0 ;;
    *) echo "unknown argument: $1" >&2; usage >&2; exit 2 ;;
  esac
done

SHAPES=("1x1" "3x2" "8x4")
SETTLE_MS=${BENCH_SETTLE_MS:-20}
RUN_TIMEOUT_MS=$(( ${BENCH_RUN_TIMEOUT_S:-30} * 1000 ))

SCRIPT_DIR=$(cd "$(dirname "$0")" && pwd)
BUILD=${DSLAUNCH_BUILD:-$SCRIPT_DIR/../build}
DSLAUNCH=$BUILD/bin/dslaunch
DSAGENT=$BUILD/bin/dsagent
for b in "$DSLAUNCH" "$DSAGENT"; do
  [[ -x "$b" ]] || { echo "missing $b (build it or set DSLAUNCH_BUILD)" >&2; exit 2; }
done
MPIRUN=$(command -v mpirun || true)
[[ -n "$MPIRUN" ]] || { echo "mpirun not found (apt-get install openmpi-bin)" >&2; exit 2; }
CC=${CC:-cc}
command -v "$CC" >/dev/null || { echo "no C compiler ($CC)" >&2; exit 2; }

WORK=$(mktemp -d "${TMPDIR:-/tmp}/launch_local.XXXXXX")
TAG="DSLAUNCH_BENCH_TAG=$$.$RANDOM.$RANDOM"   # marks every process of this bench
HELPER=$WORK/benchhelper
CURRENT_PID=""

cleanup() {
  local rc=$?
  trap - EXIT INT TERM HUP
  if [[ -n "$CURRENT_PID" ]]; then
    kill -TERM "$CURRENT_PID" 2>/dev/null || true
    wait "$CURRENT_PID" 2>/dev/null || true
  fi
  if [[ -x "$HELPER" ]]; then
    "$HELPER" reap "$TAG" TERM >/dev/null 2>&1 || true
    sleep 0.2
    "$HELPER" reap "$TAG" KILL >/dev/null 2>&1 || true
  fi
  rm -rf "$WORK"
  exit "$rc"
}
trap cleanup EXIT
trap 'echo "interrupted" >&2; exit 130' INT
trap 'exit 143' TERM
trap 'exit 129' HUP

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

/* rank DIR SETTLE_MS ds|mpi (which environment names the rank) */
static int rank_main(char** argv) {
  long long t = now_ns();
  const char* dir = argv[0];
  long long settle_ms = atoll(argv[1]);
  int mpi = strcmp(argv[2], "mpi") == 0;
  int rank = env_int(mpi ? "OMPI_COMM_WORLD_RANK" : "RANK");
  int size = env_int(mpi ? "OMPI_COMM_WORLD_SIZE" : "WORLD_SIZE");
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

/* run DIR NRANKS TIMEOUT_MS CMD... ; stdout: launch_ns teardown_ns exitcode leftovers */
static int run_main(char** argv) {
  const char* dir = argv[0];
  int nranks = atoi(argv[1]);
  long long timeout_ms = atoll(argv[2]);
  char** cmd = argv + 3;
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
  int status = 0;
  long long t1;
  if (pfd >= 0) {
    struct pollfd p = {pfd, POLLIN, 0};
    int r;
    do r = poll(&p, 1, (int)timeout_ms); while (r < 0 && errno == EINTR);
    if (r == 0) {
      kill(pid, SIGTERM);
      waitpid(pid, &status, 0);
      printf("TIMEOUT\n");
      return 0;
    }
    waitpid(pid, &status, 0);
    t1 = now_ns();
  } else {  /* old kernel: poll waitpid */
    long long deadline = t0 + timeout_ms * 1000000LL;
    for (;;) {
      pid_t w = waitpid(pid, &status, WNOHANG);
      if (w == pid) break;
      if (now_ns() > deadline) {
        kill(pid, SIGTERM);
        waitpid(pid, &status, 0);
        printf("TIMEOUT\n");
        return 0;
      }
      sleep_ns(100000);
    }
    t1 = now_ns();
  }
  int leftovers = 0, started = 0;
  long long last_start = 0;
  for (int r = 0; r < nranks; r++) {
    char path[4096];
    snprintf(path, sizeof path, "%s/start.%d", dir, r);
    FILE* f = fopen(path, "r");
    if (!f) continue;
    long long ts = 0;
    int rpid = 0;
    if (fscanf(f, "%lld %d", &ts, &rpid) == 2) {
      started++;
      if (ts > last_start) last_start = ts;
      if (alive(rpid)) leftovers++;
    }
    fclose(f);
  }
  long long t_exit = 0;
  char path[4096];
  snprintf(path, sizeof path, "%s/exit", dir);
  FILE* f = fopen(path, "r");
  if (f) { if (fscanf(f, "%lld", &t_exit) != 1) t_exit = 0; fclose(f); }
  int code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  if (started < nranks || t_exit == 0) {
    printf("INCOMPLETE started=%d/%d exit_recorded=%d code=%d leftovers=%d\n",
           started, nranks, t_exit != 0, code, leftovers);
    return 0;
  }
  printf("%lld %lld %d %d\n", last_start - t0, t1 - t_exit, code, leftovers);
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
  if (argc >= 5 && strcmp(argv[1], "rank") == 0) return rank_main(argv + 2);
  if (argc >= 6 && strcmp(argv[1], "run") == 0) return run_main(argv + 2);
  if (argc >= 4 && strcmp(argv[1], "reap") == 0) return reap_main(argv + 2);
  fprintf(stderr, "usage: benchhelper rank DIR SETTLE_MS ds|mpi | run DIR NRANKS TIMEOUT_MS CMD... | reap MARKER TERM|KILL|NONE\n");
  return 2;
}
EOF
"$CC" -O2 -o "$HELPER" "$WORK/benchhelper.c"

# ------------------------------------------------------------- launchers ---
MPI_FLAGS=()
if [[ $(id -u) -eq 0 ]]; then MPI_FLAGS=(--allow-run-as-root); fi
read -r -a MPI_EXTRA <<<"${BENCH_MPIRUN_ARGS:-}"
MPI_FLAGS+=("${MPI_EXTRA[@]}")

# cmd_for LAUNCHER NODES PER_NODE DIR -> fills CMD array
cmd_for() {
  local launcher=$1 nodes=$2 per=$3 dir=$4
  if [[ $launcher == dslaunch ]]; then
    local hf=$WORK/hostfile.${nodes}x${per} i
    if [[ ! -f $hf ]]; then
      for ((i = 1; i <= nodes; i++)); do echo "127.0.0.$i slots=$per"; done >"$hf"
    fi
    CMD=("$DSLAUNCH" --hostfile "$hf" --launcher local --no_local_rank
         "$HELPER" rank "$dir" "$SETTLE_MS" ds)
  else
    CMD=("$MPIRUN" "${MPI_FLAGS[@]}" --oversubscribe -np $((nodes * per))
         "$HELPER" rank "$dir" "$SETTLE_MS" mpi)
  fi
}

ERRORS=0
# one_run LAUNCHER NODES PER_NODE -> sets RESULT ("launch_ns teardown_ns") or ""
one_run() {
  local launcher=$1 nodes=$2 per=$3
  local n=$((nodes * per)) dir=$WORK/run out log line left code leftovers
  rm -rf "$dir"; mkdir -p "$dir"
  log=$WORK/last.$launcher.log
  cmd_for "$launcher" "$nodes" "$per" "$dir"
  out=$WORK/result
  env "$TAG" "$HELPER" run "$dir" "$n" "$RUN_TIMEOUT_MS" "${CMD[@]}" \
      </dev/null >"$out" 2>"$log" &
  CURRENT_PID=$!
  wait "$CURRENT_PID" || true
  CURRENT_PID=""
  line=$(cat "$out")
  # anything of this run still alive (agents, orted, ranks) is killed here
  left=$("$HELPER" reap "$TAG" KILL)
  RESULT=""
  case "$line" in
    TIMEOUT|INCOMPLETE*)
      echo "ERROR: $launcher ${nodes}x${per}: run failed: $line; launcher output:" >&2
      tail -n 15 "$log" | sed 's/^/    /' >&2
      ERRORS=$((ERRORS + 1))
      ;;
    *)
      read -r launch teardown code leftovers <<<"$line"
      if [[ $code -ne 1 ]]; then
        echo "ERROR: $launcher ${nodes}x${per}: launcher exited $code, expected 1" >&2
        ERRORS=$((ERRORS + 1))
      fi
      if [[ $leftovers -ne 0 ]]; then
        echo "ERROR: $launcher ${nodes}x${per}: $leftovers rank(s) still alive when the launcher returned" >&2
        ERRORS=$((ERRORS + 1))
      fi
      RESULT="$launch $teardown"
      ;;
  esac
  if [[ $left -ne 0 ]]; then
    echo "ERROR: $launcher ${nodes}x${per}: $left process(es) of the run left behind (killed)" >&2
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

# ----------------------------------------------------------------- header ---
echo "# dslaunch local launch benchmark, $(date -u '+%Y-%m-%d %H:%M UTC')"
echo "machine: $(nproc) CPUs ($(grep -m1 'model name' /proc/cpuinfo 2>/dev/null | cut -d: -f2- | sed 's/^ *//')), kernel $(uname -sr), $(awk '/MemTotal/ {printf "%.0f GiB RAM", $2/1048576}' /proc/meminfo)"
echo "dslaunch: $("$DSLAUNCH" --version 2>&1 | head -n1) ($DSLAUNCH)"
echo "mpirun:   $("$MPIRUN" --version 2>&1 | head -n1) ($MPIRUN)${BENCH_MPIRUN_ARGS:+, extra args: $BENCH_MPIRUN_ARGS}"
echo "runs per cell: $RUNS (median), settle before the failing rank exits: ${SETTLE_MS} ms"
echo

declare -A LAUNCH TEARDOWN
for shape in "${SHAPES[@]}"; do
  nodes=${shape%x*}; per=${shape#*x}
  : >"$WORK/ds.launch"; : >"$WORK/ds.teardown"; : >"$WORK/mpi.launch"; : >"$WORK/mpi.teardown"
  # one discarded warm-up run each, then alternate so drift hits both alike
  one_run dslaunch "$nodes" "$per"
  one_run mpirun "$nodes" "$per"
  for ((r = 1; r <= RUNS; r++)); do
    printf '\r%s: run %d/%d ' "$shape" "$r" "$RUNS" >&2
    for launcher in dslaunch mpirun; do
      one_run "$launcher" "$nodes" "$per"
      if [[ -n $RESULT ]]; then
        read -r l t <<<"$RESULT"
        p=ds; [[ $launcher == mpirun ]] && p=mpi
        echo "$l" >>"$WORK/$p.launch"
        echo "$t" >>"$WORK/$p.teardown"
      fi
    done
  done
  printf '\r%*s\r' 30 '' >&2
  for p in ds mpi; do
    LAUNCH[$p.$shape]=$(median_ms <"$WORK/$p.launch")
    TEARDOWN[$p.$shape]=$(median_ms <"$WORK/$p.teardown")
  done
done

fmt='| %-5s | %5s | %18s | %16s | %20s | %18s |\n'
# shellcheck disable=SC2059
printf "$fmt" shape ranks "dslaunch launch ms" "mpirun launch ms" "dslaunch teardown ms" "mpirun teardown ms"
printf '|-------|------:|-------------------:|-----------------:|---------------------:|-------------------:|\n'
for shape in "${SHAPES[@]}"; do
  nodes=${shape%x*}; per=${shape#*x}
  # shellcheck disable=SC2059
  printf "$fmt" "$shape" $((nodes * per)) "${LAUNCH[ds.$shape]}" "${LAUNCH[mpi.$shape]}" \
    "${TEARDOWN[ds.$shape]}" "${TEARDOWN[mpi.$shape]}"
done
echo
echo "dslaunch: N nodes = 127.0.0.1..127.0.0.N (one dsagent each), --launcher local."
echo "mpirun:   one host, -np <ranks> --oversubscribe (no notion of the 127.0.0.x nodes)."
echo "launch = last rank started - launcher invoked; teardown = failing rank's exit(1) - launcher returned."
if ((ERRORS)); then
  echo "ERRORS: $ERRORS (see messages above)" >&2
  exit 1
fi
