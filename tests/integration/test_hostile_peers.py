"""The launcher's control port against hostile peers (idle connections,
connect/close floods, garbage writers), a rank that floods progress records,
and where the control port listens. Every case is bounded in count and time."""
import os
import re
import signal
import socket
import stat
import struct
import threading
import time
import unittest

from harness import BIN, DSLAUNCH, PY, LaunchTest

# A rank program: records its start like rank.py, then
#   hold:        waits (bounded) until $OUT_DIR/go exists, then exits 0;
#   flood N PAD: local rank 0 of each node waits for $OUT_DIR/flood-go, writes
#                N progress records (PAD bytes of padding each) as fast as it
#                can and creates $OUT_DIR/flooded-RANK; the others print 2000
#                numbered lines; every rank then exits 0.
RANK_SRC = r'''
import os, socket, sys, time
RANK = int(os.environ["RANK"]); OUT = os.environ["OUT_DIR"]
tmp = os.path.join(OUT, ".start-%d.tmp" % RANK)
with open(tmp, "w") as f:
    f.write("%d %d\n" % (time.time_ns(), os.getpid()))
os.rename(tmp, os.path.join(OUT, "start-%d" % RANK))
if sys.argv[1] == "hold":
    deadline = time.monotonic() + 60
    while not os.path.exists(os.path.join(OUT, "go")):
        if time.monotonic() > deadline:
            sys.exit(3)
        time.sleep(0.02)
    print("rank %d done" % RANK, flush=True)
elif sys.argv[1] == "flood":
    n, pad = int(sys.argv[2]), "x" * int(sys.argv[3])
    if os.environ["LOCAL_RANK"] == "0":
        deadline = time.monotonic() + 60
        while not os.path.exists(os.path.join(OUT, "flood-go")):
            if time.monotonic() > deadline:
                sys.exit(3)
            time.sleep(0.02)
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.connect(os.environ["DSLAUNCH_PROGRESS"])
        chunk = 10000
        for base in range(0, n, chunk):
            s.sendall("".join('{"step": %d, "loss": 1.5, "pad": "%s"}\n' % (i, pad)
                              for i in range(base, min(n, base + chunk))).encode())
        s.close()
        open(os.path.join(OUT, "flooded-%d" % RANK), "w").close()
        print("rank %d flooded %d" % (RANK, n), flush=True)
    else:
        for i in range(2000):
            print("rank %d line %d" % (RANK, i))
        sys.stdout.flush()
'''

# An agent that waits (bounded) for $OUT_DIR/agents-go before it starts, so a
# test can act while the launcher is still waiting for its agents.
AGENT_SRC = """#!/bin/sh
i=0
while [ ! -e "$OUT_DIR/agents-go" ] && [ $i -lt 3000 ]; do sleep 0.01; i=$((i+1)); done
exec "%s" "$@"
"""

RSS_LIMIT_KB = 100 * 1024


class Job:
    """A running dslaunch whose stdout and stderr are read on threads (so the
    launcher never blocks on a full pipe) and whose control port is known."""

    def __init__(self, test, argv):
        self.proc = test.start_job(argv)
        self.err_lines, self.out_chunks = [], []
        self.port_seen = threading.Event()
        self.port = None
        self._threads = [threading.Thread(target=self._read_err, daemon=True),
                         threading.Thread(target=self._read_out, daemon=True)]
        for t in self._threads:
            t.start()
        test.assertTrue(self.port_seen.wait(20), "no control port in: %s" % self.stderr())
        test.assertIsNotNone(self.port, "launcher ended early: %s" % self.stderr())

    def _read_err(self):
        for raw in self.proc.stderr:
            line = raw.decode(errors="replace")
            self.err_lines.append(line)
            m = re.search(r"control server on port (\d+)", line)
            if m and self.port is None:
                self.port = int(m.group(1))
                self.port_seen.set()
        self.port_seen.set()

    def _read_out(self):
        for raw in self.proc.stdout:
            self.out_chunks.append(raw)

    def status_kb(self, field):
        with open("/proc/%d/status" % self.proc.pid) as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
        raise AssertionError(field + " not found")

    def wait(self, timeout=60):
        self.proc.wait(timeout)
        for t in self._threads:
            t.join(10)
        return self.proc.returncode

    def stderr(self):
        return "".join(self.err_lines)

    def stdout(self):
        return b"".join(self.out_chunks).decode(errors="replace")


def idle_connections(port, count):
    socks = []
    for _ in range(count):
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        s.connect(("127.0.0.1", port))
        socks.append(s)
    return socks


def close_all(socks):
    for s in socks:
        s.close()


def connect_close_loop(port, cycles, garbage, connected):
    """`cycles` connections closed with RST at once (SO_LINGER 0: no
    TIME_WAIT); with `garbage`, each first writes junk bytes. Appends the
    number that connected to `connected`."""
    linger = struct.pack("ii", 1, 0)
    junk = os.urandom(512)
    ok = 0
    for _ in range(cycles):
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, linger)
        try:
            s.connect(("127.0.0.1", port))
            ok += 1
            if garbage:
                s.send(junk)
        except OSError:
            pass
        s.close()
    connected.append(ok)


class HostilePeers(LaunchTest):
    def setUp(self):
        super().setUp()
        self.rank_py = os.path.join(self.dir, "hostile_rank.py")
        with open(self.rank_py, "w") as f:
            f.write(RANK_SRC)

    def slow_agent(self):
        path = os.path.join(self.dir, "slow_agent.sh")
        with open(path, "w") as f:
            f.write(AGENT_SRC % os.path.join(BIN, "dsagent"))
        os.chmod(path, stat.S_IRWXU)
        return path

    def release(self, name):
        open(os.path.join(self.out, name), "w").close()

    def rejection_lines(self, job):
        return [l for l in job.err_lines if "rejected" in l]

    def test_200_idle_connections_during_start_and_run_do_not_stop_the_job(self):
        job = Job(self, self.args(extra=["--log_level", "info",
                                         "--agent_path", self.slow_agent()])
                  + [PY, self.rank_py, "hold"])
        held = idle_connections(job.port, 200)  # before any agent connects
        self.release("agents-go")
        self.wait_started(6)
        held += idle_connections(job.port, 200)  # and while the job runs
        self.assertIsNone(job.proc.poll(), job.stderr())
        hwm = job.status_kb("VmHWM")
        self.release("go")
        code = job.wait()
        close_all(held)
        self.assertEqual(code, 0, job.stderr())
        self.assertLess(hwm, RSS_LIMIT_KB)
        self.assertLessEqual(len(self.rejection_lines(job)), 3, job.stderr())

    def test_20000_connect_close_cycles_and_garbage_writers_leave_the_job_alone(self):
        job = Job(self, self.args(extra=["--log_level", "info"]) + [PY, self.rank_py, "hold"])
        self.wait_started(6)
        start = time.monotonic()
        connected = []
        threads = [threading.Thread(target=connect_close_loop,
                                    args=(job.port, 4000, i == 0, connected), daemon=True)
                   for i in range(5)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(50)
        elapsed = time.monotonic() - start
        self.assertFalse(any(t.is_alive() for t in threads), "flood did not finish")
        self.assertGreaterEqual(sum(connected), 19000)
        self.assertLess(elapsed, 45)
        self.assertIsNone(job.proc.poll(), job.stderr())
        hwm = job.status_kb("VmHWM")
        self.release("go")
        code = job.wait()
        self.assertEqual(code, 0, job.stderr())
        self.assertLess(hwm, RSS_LIMIT_KB, "launcher peak RSS %d kB" % hwm)
        # One summary line per 10 s of flood, plus the last one at the end.
        self.assertLessEqual(len(self.rejection_lines(job)), elapsed / 10 + 2, job.stderr())
        summary = "".join(self.rejection_lines(job))
        counts = [int(n) for n in re.findall(r"rejected (\d+) unauthenticated", summary)]
        self.assertGreaterEqual(sum(counts), sum(connected), summary)
        print("20000 cycles in %.1f s, launcher VmHWM %d kB" % (elapsed, hwm))

    def test_ranks_flooding_progress_records_lose_records_not_the_job(self):
        # One flooding rank per node (ranks 0 and 2: a million records of
        # ~330 bytes each, more than the agent's 256 MiB channel queue) while
        # the launcher is stopped, so that nothing drains meanwhile; ranks 1
        # and 3 print ordinary output.
        n = 1000000
        job = Job(self, self.args(nodes=2, slots=2,
                                  extra=["--log_level", "info", "--log_dir", self.out,
                                         "--heartbeat_timeout", "60"])
                  + [PY, self.rank_py, "flood", str(n), "300"])
        self.wait_started(4)
        flooded = [os.path.join(self.out, "flooded-%d" % r) for r in (0, 2)]
        os.kill(job.proc.pid, signal.SIGSTOP)
        try:
            self.release("flood-go")
            deadline = time.monotonic() + 40
            while not all(os.path.exists(f) for f in flooded):
                if time.monotonic() > deadline or job.proc.poll() is not None:
                    break
                time.sleep(0.05)
            done_while_stopped = all(os.path.exists(f) for f in flooded)
            peak = job.status_kb("VmHWM")
        finally:
            os.kill(job.proc.pid, signal.SIGCONT)
        while job.proc.poll() is None:
            try:
                peak = job.status_kb("VmHWM")
            except (FileNotFoundError, ProcessLookupError, AssertionError):
                break
            time.sleep(0.2)  # sampling the launcher's size, not synchronisation
        code = job.wait(120)
        self.assertEqual(code, 0, job.stderr()[-3000:])
        self.assertTrue(done_while_stopped, "the flooding ranks were stalled")
        self.assertLess(peak, RSS_LIMIT_KB)
        out = job.stdout()
        for rank in (1, 3):
            self.assertEqual(len(re.findall(r"rank %d line \d+\n" % rank, out)), 2000)
        delivered = {0: 0, 2: 0}
        with open(os.path.join(self.out, "metrics.jsonl")) as f:
            for line in f:
                delivered[int(re.search(r'"rank": ?(\d+)', line).group(1))] += 1
        for rank in (0, 2):
            self.assertIn("rank %d flooded %d" % (rank, n), out)
            m = re.search(r"rank %d: (\d+) progress record\(s\) dropped" % rank, job.stderr())
            self.assertTrue(m, job.stderr()[-3000:])
            self.assertEqual(delivered[rank] + int(m.group(1)), n)
        print("launcher VmHWM %d kB, delivered %s" % (peak, delivered))

    def test_a_loopback_plan_listens_on_loopback_only(self):
        job = Job(self, self.args(extra=["--log_level", "info"]) + [PY, self.rank_py, "hold"])
        try:
            listeners = []
            for table in ("/proc/net/tcp", "/proc/net/tcp6"):
                with open(table) as f:
                    for row in f.read().splitlines()[1:]:
                        local, st = row.split()[1], row.split()[3]
                        addr, port = local.split(":")
                        if st == "0A" and int(port, 16) == job.port:
                            listeners.append(addr)
            self.assertEqual(listeners, ["0100007F"], "listening on %s" % listeners)
        finally:
            self.release("go")
            job.wait()


if __name__ == "__main__":
    unittest.main()
