"""Shared helpers for the integration tests: run dslaunch on this machine with
127.0.0.1-3 as three nodes, and check that nothing it started is left."""
import json
import os
import re
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import unittest

BIN = os.environ.get("DSL_BIN", os.path.join(os.path.dirname(__file__), "../../build/bin"))
DSLAUNCH = os.path.join(BIN, "dslaunch")
RANK_PY = os.path.join(os.path.dirname(os.path.abspath(__file__)), "rank.py")
PY = sys.executable
# Debian's interpreter: python3-torch and python3-mpi4py live there only.
SYSTEM_PY = "/usr/bin/python3"
MPI_RANK_PY = os.path.join(os.path.dirname(os.path.abspath(__file__)), "mpi_rank.py")


def need_mpi(test):
    """Skips `test` without OpenMPI's mpirun or Debian's python3-mpi4py
    (fails it under CI=1)."""
    missing = None
    if shutil.which("mpirun") is None:
        missing = "OpenMPI's mpirun (openmpi-bin)"
    elif subprocess.run([SYSTEM_PY, "-c", "import mpi4py"], capture_output=True).returncode:
        missing = "Debian's python3-mpi4py"
    if missing:
        if os.environ.get("CI"):
            test.fail(missing + " is missing")
        test.skipTest(missing + " is not installed")


class LaunchTest(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory(prefix="dsl-it-")
        self.dir = self.tmp.name
        self.out = os.path.join(self.dir, "out")
        os.mkdir(self.out)

    def tearDown(self):
        self.assert_no_leftovers()
        self.tmp.cleanup()

    def rank_files(self, kind, world=6):
        """Each rank's OUT_DIR/<kind>-<rank>.json, by rank."""
        out = []
        for rank in range(world):
            with open(os.path.join(self.out, "%s-%d.json" % (kind, rank))) as f:
                out.append(json.load(f))
        return out

    def hostfile(self, nodes=3, slots=2):
        path = os.path.join(self.dir, "hosts.txt")
        with open(path, "w") as f:
            for n in range(nodes):
                f.write("127.0.0.%d slots=%d\n" % (n + 1, slots))
        return path

    def args(self, nodes=3, slots=2, extra=()):
        return [DSLAUNCH, "--hostfile", self.hostfile(nodes, slots),
                "--launcher", "local", "--no_local_rank", *extra]

    def env(self, **kw):
        env = dict(os.environ)
        env["OUT_DIR"] = self.out
        env.update(kw)
        return env

    def run_job(self, argv, timeout=60, **env):
        start = time.monotonic()
        p = subprocess.run(argv, capture_output=True, timeout=timeout, env=self.env(**env))
        p.elapsed = time.monotonic() - start
        p.end_ns = time.time_ns()  # wall clock, comparable with rank.py's start files
        return p

    def start_job(self, argv, **env):
        return subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                env=self.env(**env))

    def read_until(self, job, stream, pattern, count=1, timeout=20):
        """Reads `job`'s `stream` ("stdout" or "stderr", a pipe) until the regex
        `pattern` matches `count` times in what was read; returns all of it
        (also kept for seen()). Fails the test at the deadline or at EOF."""
        fd = getattr(job, stream).fileno()
        buf = self.seen_buffers(job).setdefault(stream, bytearray())
        rx = re.compile(pattern, re.M)
        deadline = time.monotonic() + timeout
        while len(rx.findall(buf.decode(errors="replace"))) < count:
            left = deadline - time.monotonic()
            if left <= 0:
                self.fail("no %d x %r on the job's %s within %g s; it wrote:\n%s"
                          % (count, pattern, stream, timeout, buf.decode(errors="replace")[-3000:]))
            if select.select([fd], [], [], left)[0]:
                chunk = os.read(fd, 65536)
                if not chunk:
                    self.fail("the job's %s ended before %d x %r:\n%s"
                              % (stream, count, pattern, buf.decode(errors="replace")[-3000:]))
                buf += chunk
        return buf.decode(errors="replace")

    def seen_buffers(self, job):
        if not hasattr(job, "dsl_seen"):
            job.dsl_seen = {}
        return job.dsl_seen

    def seen(self, job, stream):
        """What read_until already took from `job`'s `stream` (bytes)."""
        return bytes(self.seen_buffers(job).get(stream, b""))

    def started_pids(self):
        pids = []
        for name in os.listdir(self.out):
            if name.startswith("start-"):
                with open(os.path.join(self.out, name)) as f:
                    pids.append(int(f.read().split()[1]))
        return pids

    def wait_started(self, count, timeout=20):
        deadline = time.monotonic() + timeout
        while len(self.started_pids()) < count:
            self.assertLess(time.monotonic(), deadline, "ranks did not start")
            time.sleep(0.02)

    def alive(self, pid):
        try:
            with open("/proc/%d/stat" % pid) as f:
                state = f.read().rsplit(")", 1)[1].split()[0]
            return state != "Z"
        except FileNotFoundError:
            return False

    def assert_no_leftovers(self, within=5.0):
        """Every rank process this test started is gone (zombies count as gone)."""
        deadline = time.monotonic() + within
        while True:
            left = [p for p in self.started_pids() if self.alive(p)]
            if not left:
                return
            if time.monotonic() > deadline:
                for p in left:
                    os.kill(p, signal.SIGKILL)
                self.fail("rank processes left running: %s" % left)
            time.sleep(0.05)
