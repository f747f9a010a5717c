"""The console and the sinks under --log_dir: a terminal that does not read
never stops the job, log lines stay whole and byte-exact however long, a full
log file system is reported (exit 74), and logs are private."""
import os
import signal
import stat
import subprocess
import threading
import time
import unittest

from harness import LaunchTest, PY

HB = ["--heartbeat_interval", "0.2", "--heartbeat_timeout", "1"]

# Each rank writes LINES lines of about 1 KiB to stdout, then sleeps SLEEP s.
SPAM = r"""
import os, sys, time
rank = int(os.environ["RANK"])
lines, sleep = int(sys.argv[1]), float(sys.argv[2])
open(os.path.join(os.environ["OUT_DIR"], "start-%d" % rank), "w").write(
    "%d %d\n" % (time.time_ns(), os.getpid()))
out = sys.stdout.buffer
for i in range(lines):
    out.write(b"rank %d line %d %s\n" % (rank, i, b"x" * (1000 + i % 17)))
out.flush()
time.sleep(sleep)
"""


def spam_log(rank, lines):
    return b"".join(b"rank %d line %d %s\n" % (rank, i, b"x" * (1000 + i % 17))
                    for i in range(lines))


class Reader(threading.Thread):
    """Reads a pipe to its end in the background."""

    def __init__(self, pipe):
        super().__init__(daemon=True)
        self.pipe, self.data = pipe, bytearray()
        self.start()

    def run(self):
        while True:
            chunk = self.pipe.read1(1 << 16)
            if not chunk:
                return
            self.data += chunk

    def text(self):
        self.join(timeout=10)
        return self.data.decode(errors="replace")


class StalledTerminal(LaunchTest):
    LINES = 40000  # per rank: 2 ranks write ~80 MiB, past the 64 MiB queue

    def start_stalled(self, sleep):
        logs = os.path.join(self.dir, "logs")
        job = self.start_job(self.args(nodes=1, slots=2, extra=HB + ["--log_dir", logs]) +
                             [PY, "-c", SPAM, str(self.LINES), str(sleep)])
        def cleanup():
            if job.poll() is None:
                job.kill()
                job.wait()
            job.stdout.close()
            job.stderr.close()
        self.addCleanup(cleanup)
        return job, logs, Reader(job.stderr)  # stderr is read; stdout is not

    def assert_logs_complete(self, logs):
        for r in range(2):
            with open(os.path.join(logs, "rank-%d.log" % r), "rb") as f:
                self.assertTrue(f.read() == spam_log(r, self.LINES), "rank-%d.log" % r)

    def wait_logs(self, logs, timeout):
        want = sum(len(spam_log(r, self.LINES)) for r in range(2))
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                got = sum(os.path.getsize(os.path.join(logs, "rank-%d.log" % r))
                          for r in range(2))
            except FileNotFoundError:
                got = 0
            if got == want:
                return
            time.sleep(0.05)
        self.fail("the rank logs did not fill up: the launcher is blocked")

    def test_job_outlives_heartbeat_timeout_with_stdout_unread(self):
        job, logs, err = self.start_stalled(sleep=3)  # 3x the heartbeat timeout
        try:
            code = job.wait(timeout=60)
        except subprocess.TimeoutExpired:
            job.kill()
            self.fail("the launcher hung on a terminal that does not read")
        self.assertEqual(code, 0, err.text()[-3000:])
        self.assert_logs_complete(logs)
        self.assertRegex(err.text(), r"dslaunch: \d+ console lines dropped \(\d+ stdout, 0 "
                         r"stderr: the terminal did not keep up\); rank logs in .* are complete")
        self.assertIn("all 2 ranks on 1 node exited 0", err.text())

    def test_ctrl_c_is_honoured_while_stdout_is_stalled(self):
        job, logs, err = self.start_stalled(sleep=60)
        self.wait_logs(logs, timeout=40)  # everything is in the logs: stdout dropped
        start = time.monotonic()
        job.send_signal(signal.SIGINT)
        try:
            code = job.wait(timeout=15)
        except subprocess.TimeoutExpired:
            job.kill()
            self.fail("SIGINT ignored while the terminal was stalled")
        self.assertLess(time.monotonic() - start, 10)
        self.assertEqual(code, 130, err.text()[-3000:])
        self.assertIn("interrupted by the user (SIGINT)", err.text())
        self.assert_logs_complete(logs)

    def test_reader_that_resumes_gets_a_note_and_the_rest(self):
        job, logs, err = self.start_stalled(sleep=4)
        self.wait_logs(logs, timeout=40)
        out = Reader(job.stdout)  # the reader resumes
        self.assertEqual(job.wait(timeout=60), 0, err.text()[-3000:])
        lines = out.text().splitlines()
        self.assertGreater(len(lines), 1000)
        for line in lines:  # whatever was shown is whole
            self.assertRegex(line, r"^\[127\.0\.0\.1:(\d)\] rank \1 line \d+ x{1000,1016}$")
        self.assertRegex(err.text(), r"\d+ console lines dropped")


# Rank 0: a 5 MiB line on stdout written in pieces while short lines go to
# stderr, a line of exactly 1 MiB, one of 2 MiB + 1, and a last line without
# a newline. Lines are made of one repeated letter so they are told apart.
LONG_LINES = r"""
import os, sys, time
out, err = sys.stdout.buffer, sys.stderr.buffer
MiB = 1 << 20
for i in range(10):
    out.write(b"a" * (MiB // 2)); out.flush()
    err.write(b"short %d\n" % i); err.flush()
    time.sleep(0.02)
out.write(b"\n")
out.write(b"b" * MiB + b"\n")
out.write(b"c" * (2 * MiB + 1) + b"\n")
err.write(b"err without newline")
out.write(b"tail without newline")
"""


class LongLines(LaunchTest):
    def test_every_line_is_whole_and_byte_exact_in_the_log(self):
        logs = os.path.join(self.dir, "logs")
        p = self.run_job(self.args(nodes=1, slots=1) + ["--log_dir", logs, PY, "-c", LONG_LINES])
        self.assertEqual(p.returncode, 0, p.stderr.decode()[-2000:])
        MiB = 1 << 20
        with open(os.path.join(logs, "rank-0.log"), "rb") as f:
            log = f.read()
        lines = log.split(b"\n")
        want = [b"a" * (5 * MiB), b"b" * MiB, b"c" * (2 * MiB + 1)] + \
            [b"short %d" % i for i in range(10)] + \
            [b"err without newline", b"tail without newline"]
        self.assertEqual(sorted(len(x) for x in lines), sorted(len(x) for x in want))
        self.assertEqual(sorted(lines), sorted(want))
        self.assertFalse(log.endswith(b"\n"))  # a last line without newline stays so
        self.assertLess(lines.index(b"b" * MiB), lines.index(b"c" * (2 * MiB + 1)))
        self.assertLess(lines.index(b"a" * (5 * MiB)), lines.index(b"b" * MiB))
        # The terminal shows the pieces as they come, each with the prefix.
        shown = b"".join(line[len(b"[127.0.0.1:0] "):] for line in p.stdout.split(b"\n")
                         if line.startswith(b"[127.0.0.1:0] a"))
        self.assertEqual(shown, b"a" * (5 * MiB))


class LogDirSinks(LaunchTest):
    mounted = None

    def tearDown(self):
        if self.mounted:
            subprocess.run(["umount", "-l", self.mounted])
        super().tearDown()
    def run_umask(self, argv, umask):
        return subprocess.run(argv, capture_output=True, timeout=60, env=self.env(),
                              preexec_fn=lambda: os.umask(umask))

    def test_logs_and_metrics_are_private(self):
        logs = os.path.join(self.dir, "new", "logs")
        p = self.run_umask(self.args(nodes=1, slots=2) + ["--log_dir", logs, "true"], 0o022)
        self.assertEqual(p.returncode, 0, p.stderr.decode())
        for name in ("rank-0.log", "rank-1.log", "metrics.jsonl"):
            self.assertEqual(stat.S_IMODE(os.stat(os.path.join(logs, name)).st_mode), 0o600, name)
        self.assertEqual(stat.S_IMODE(os.stat(logs).st_mode), 0o700)
        # A umask that shuts out others lets the group read: 0640, never more.
        logs2 = os.path.join(self.dir, "logs2")
        p = self.run_umask(self.args(nodes=1, slots=1) + ["--log_dir", logs2, "true"], 0o027)
        self.assertEqual(p.returncode, 0, p.stderr.decode())
        self.assertEqual(stat.S_IMODE(os.stat(os.path.join(logs2, "rank-0.log")).st_mode), 0o640)
        self.assertEqual(stat.S_IMODE(os.stat(logs2).st_mode), 0o750)

    def test_full_log_file_system_is_reported_and_exits_74(self):
        if os.geteuid() != 0:
            self.skipTest("needs root to mount a small tmpfs")
        logs = os.path.join(self.dir, "small")
        os.mkdir(logs)
        m = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", logs],
                           capture_output=True)
        if m.returncode != 0:
            self.skipTest("cannot mount a tmpfs: %s" % m.stderr.decode().strip())
        self.mounted = logs
        p = self.run_job(self.args(nodes=1, slots=2, extra=["--log_dir", logs]) +
                         [PY, "-c", SPAM, "400", "0"])  # 2 x 400 KiB > 256 KiB
        err = p.stderr.decode()
        self.assertEqual(p.returncode, 74, err[-3000:])
        failed = [r for r in range(2) if "cannot write %s/rank-%d.log: No space left on device"
                  % (logs, r) in err]
        self.assertTrue(failed, err[-3000:])
        for r in failed:  # once per file
            self.assertEqual(err.count("cannot write %s/rank-%d.log" % (logs, r)), 1)
        # The console still showed every line.
        out = p.stdout.decode().splitlines()
        self.assertEqual(len(out), 800)


if __name__ == "__main__":
    unittest.main()
