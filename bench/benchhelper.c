/* benchhelper: the rank program, the timed launcher run and the process
 * reaper of the launch benchmarks (bench/launch_local.sh and
 * bench/launch_cluster.sh compile it into their temp dir with $CC -O2).
 *
 *   rank DIR SETTLE_MS ds|mpi|slurm
 *       a rank: first thing, writes "<CLOCK_REALTIME ns> <pid>" to
 *       DIR/start.<rank>. The rank and world size come from RANK and
 *       WORLD_SIZE (ds: dslaunch, or a shell that sets them like pdsh's
 *       remote command), from OMPI_COMM_WORLD_RANK and OMPI_COMM_WORLD_SIZE
 *       (mpi: mpirun) or from SLURM_PROCID and SLURM_NTASKS (slurm: srun). The last rank waits until every rank has written its
 *       start file, sleeps SETTLE_MS, writes the time to DIR/exit and exits 1;
 *       all other ranks sleep 60 s.
 *   run DIR NRANKS TIMEOUT_MS CAP_MS CMD...
 *       forks and execs CMD (the launcher), waits for it and prints one line:
 *         OK launch_ns teardown_ns exitcode leftovers
 *           launch = latest rank start - instant before the fork, teardown =
 *           launcher reaped - failing rank's exit, leftovers = ranks alive
 *           (not zombies) right after the launcher returned
 *         CAPPED launch_ns alive_at_cap alive_after_kill
 *           only with CAP_MS > 0: the launcher had not exited CAP_MS after the
 *           failing rank's exit; it was SIGTERMed (SIGKILL after 2 s)
 *         TIMEOUT ... | INCOMPLETE ...
 *           the launcher ran past TIMEOUT_MS (it was stopped like above), or
 *           not every rank started or the failing rank's exit was not recorded
 *   spew LINES BYTES same|distinct
 *       a rank for bench/console.sh: writes LINES lines of BYTES characters
 *       (newline included) to stdout as fast as it can, the same text on
 *       every rank or text that differs per rank and line.
 *   reap MARKER TERM|KILL|NONE
 *       signals every process (but itself) whose environment holds the entry
 *       MARKER; prints how many were found (zombies not counted).
 */
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

/* rank DIR SETTLE_MS ds|mpi|slurm (which environment names the rank) */
static int rank_main(char** argv) {
  long long t = now_ns();
  const char* dir = argv[0];
  long long settle_ms = atoll(argv[1]);
  int mpi = strcmp(argv[2], "mpi") == 0;
  int slurm = strcmp(argv[2], "slurm") == 0;
  int rank = env_int(mpi ? "OMPI_COMM_WORLD_RANK" : slurm ? "SLURM_PROCID" : "RANK");
  int size = env_int(mpi ? "OMPI_COMM_WORLD_SIZE" : slurm ? "SLURM_NTASKS" : "WORLD_SIZE");
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

/* run DIR NRANKS TIMEOUT_MS CAP_MS CMD... (output: see the top of the file) */
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
    } else {  /* old kernel: poll waitpid (each look also reads the exit file when capped) */
      sleep_ns(cap_ms > 0 ? 1000000LL : 100000LL);
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

static int spew_main(char** argv) {
  const long lines = atol(argv[0]);
  long bytes = atol(argv[1]);
  const int distinct = strcmp(argv[2], "distinct") == 0;
  const char* r = getenv("RANK");
  if (bytes < 24) bytes = 24;
  if (bytes > 4096) bytes = 4096;
  static char buf[1 << 16];
  size_t used = 0;
  for (long i = 0; i < lines; ++i) {
    if (used + (size_t)bytes > sizeof(buf)) {
      if (fwrite(buf, 1, used, stdout) != used) return 1;
      used = 0;
    }
    char* line = buf + used;
    int n = distinct ? snprintf(line, (size_t)bytes, "rank %s line %ld ", r ? r : "?", i)
                     : snprintf(line, (size_t)bytes, "the same line on every rank ");
    memset(line + n, 'x', (size_t)(bytes - 1 - n));
    line[bytes - 1] = '\n';
    used += (size_t)bytes;
  }
  if (fwrite(buf, 1, used, stdout) != used) return 1;
  return fflush(stdout) == 0 ? 0 : 1;
}

int main(int argc, char** argv) {
  if (argc >= 5 && strcmp(argv[1], "spew") == 0) return spew_main(argv + 2);
  if (argc >= 5 && strcmp(argv[1], "rank") == 0) return rank_main(argv + 2);
  if (argc >= 7 && strcmp(argv[1], "run") == 0) return run_main(argv + 2);
  if (argc >= 4 && strcmp(argv[1], "reap") == 0) return reap_main(argv + 2);
  fprintf(stderr, "usage: benchhelper rank DIR SETTLE_MS ds|mpi | run DIR NRANKS TIMEOUT_MS CAP_MS CMD... | reap MARKER TERM|KILL|NONE\n");
  return 2;
}
