"""The launcher's Prometheus endpoint (--metrics_port) against the real tools:
a 3-rank local job reports progress; /metrics is fetched and checked by value,
`promtool check metrics` accepts it, and Debian's Prometheus server scrapes
it and answers a query. Skips itself (fails under CI=1) without promtool or
prometheus (Debian's package: prometheus)."""
import json
import os
import re
import shutil
import socket
import subprocess
import time
import unittest
import urllib.request

from harness import DSLAUNCH, PY, LaunchTest

TOTAL_STEPS = 5

# A rank: TOTAL_STEPS progress records, one per 0.2 s, then waits for $STOP_FILE.
RANK_SCRIPT = r'''#!%s
import json, os, socket, sys, time
rank = int(os.environ["RANK"])
out = os.environ["OUT_DIR"]
tmp = os.path.join(out, ".start-%%d.tmp" %% rank)
with open(tmp, "w") as f:
    f.write("%%d %%d\n" %% (time.time_ns(), os.getpid()))
os.rename(tmp, os.path.join(out, "start-%%d" %% rank))
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
s.connect(os.environ["DSLAUNCH_PROGRESS"])
for step in range(1, %d + 1):
    rec = {"step": step, "loss": 1.0 / step + rank, "tokens_per_s": 1000 + 10 * rank,
           "total_steps": %d}
    s.sendall((json.dumps(rec) + "\n").encode())
    time.sleep(0.2)
while not os.path.exists(os.environ["STOP_FILE"]):
    time.sleep(0.05)
print("rank %%d done" %% rank, flush=True)
''' % (PY, TOTAL_STEPS, TOTAL_STEPS)

PROMETHEUS_YML = """global:
  scrape_interval: 1s
  evaluation_interval: 1s
scrape_configs:
  - job_name: dslaunch
    scrape_interval: 1s
    scrape_timeout: 1s
    static_configs:
      - targets: ['127.0.0.1:%d']
"""

SAMPLE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? (\S+)$')
LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def parse_metrics(text):
    """{(name, rank or None): value} from the exposition text."""
    samples = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = SAMPLE.match(line)
        assert m, "not a sample line: %r" % line
        labels = dict(LABEL.findall(m.group(2) or ""))
        rank = int(labels["rank"]) if "rank" in labels else None
        samples[(m.group(1), rank)] = float(m.group(3))
    return samples


def http_get(url, timeout=5):
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return r.status, r.headers, r.read().decode()


class Prometheus(LaunchTest):
    def setUp(self):
        super().setUp()
        missing = [t for t in ("promtool", "prometheus") if shutil.which(t) is None]
        if missing:
            msg = "%s not installed (Debian's package: prometheus)" % " and ".join(missing)
            if os.environ.get("CI"):
                self.fail(msg)
            self.skipTest(msg)
        self.script = os.path.join(self.dir, "prom_rank.py")
        with open(self.script, "w") as f:
            f.write(RANK_SCRIPT)
        os.chmod(self.script, 0o755)
        self.stop_file = os.path.join(self.dir, "stop")
        self.port = free_port()
        self.url = "http://127.0.0.1:%d/metrics" % self.port

    def start(self):
        return self.start_job([DSLAUNCH, "--launcher", "local", "--num_gpus", "3",
                               "--log_level", "info",
                               "--metrics_port", str(self.port), "--metrics_addr", "127.0.0.1",
                               "--no_python", self.script], STOP_FILE=self.stop_file)

    def scrape_until_done(self, job, timeout=30):
        """The /metrics text once every rank reported its last step."""
        deadline = time.monotonic() + timeout
        text = ""
        while time.monotonic() < deadline:
            self.assertIsNone(job.poll(), "the launcher ended early")
            try:
                status, headers, text = http_get(self.url)
            except OSError:
                time.sleep(0.1)
                continue
            self.assertEqual(status, 200)
            self.assertEqual(headers["Content-Type"], "text/plain; version=0.0.4; charset=utf-8")
            got = parse_metrics(text)
            if all(got.get(("dslaunch_rank_step", r)) == TOTAL_STEPS for r in range(3)):
                return text
            time.sleep(0.1)
        self.fail("no final step for every rank within %g s; last scrape:\n%s" % (timeout, text))

    def check_values(self, text):
        got = parse_metrics(text)
        for r in range(3):
            self.assertEqual(got[("dslaunch_rank_total_steps", r)], TOTAL_STEPS)
            self.assertEqual(got[("dslaunch_rank_loss", r)], 1.0 / TOTAL_STEPS + r)
            self.assertEqual(got[("dslaunch_rank_tokens_per_second", r)], 1000 + 10 * r)
            self.assertEqual(got[("dslaunch_rank_progress_records_total", r)], TOTAL_STEPS)
            self.assertEqual(got[("dslaunch_rank_running", r)], 1)
            self.assertEqual(got[("dslaunch_rank_exited", r)], 0)
            self.assertNotIn(("dslaunch_rank_exit_code", r), got)
            self.assertTrue(0 <= got[("dslaunch_rank_last_seen_seconds", r)] < 30)
        self.assertEqual(got[("dslaunch_job_ranks", None)], 3)
        self.assertEqual(got[("dslaunch_job_nodes", None)], 1)
        self.assertEqual(got[("dslaunch_progress_records_total", None)], 3 * TOTAL_STEPS)
        self.assertEqual(got[("dslaunch_restarts_total", None)], 0)
        self.assertAlmostEqual(got[("dslaunch_job_start_time_seconds", None)], time.time(),
                               delta=120)

    def promtool_check(self, text):
        p = subprocess.run(["promtool", "check", "metrics"], input=text.encode(),
                           capture_output=True, timeout=30)
        self.assertEqual(p.returncode, 0, "promtool check metrics:\n%s%s\n--- body:\n%s"
                         % (p.stdout.decode(), p.stderr.decode(), text))

    def query_prometheus(self, timeout=60):
        """Runs Prometheus scraping the endpoint until dslaunch_rank_step
        answers with every rank's final step; returns the query result."""
        web = free_port()
        cfg = os.path.join(self.dir, "prometheus.yml")
        with open(cfg, "w") as f:
            f.write(PROMETHEUS_YML % self.port)
        log = open(os.path.join(self.dir, "prometheus.log"), "wb")
        server = subprocess.Popen(
            ["prometheus", "--config.file=" + cfg,
             "--storage.tsdb.path=" + os.path.join(self.dir, "tsdb"),
             "--web.listen-address=127.0.0.1:%d" % web],
            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        try:
            return self.wait_for_query(server, web, timeout)
        finally:
            server.kill()
            server.wait()
            log.close()

    def wait_for_query(self, server, web, timeout):
        url = "http://127.0.0.1:%d/api/v1/query?query=dslaunch_rank_step" % web
        deadline = time.monotonic() + timeout
        result = None
        while time.monotonic() < deadline:
            self.assertIsNone(server.poll(), "prometheus ended: " + self.prometheus_log())
            try:
                result = json.loads(http_get(url)[2])["data"]["result"]
            except (OSError, ValueError, KeyError):
                result = None
            steps = {int(s["metric"]["rank"]): float(s["value"][1]) for s in result or []}
            if steps == {r: TOTAL_STEPS for r in range(3)}:
                return result
            time.sleep(0.5)
        self.fail("prometheus did not answer with 3 ranks at step %d within %g s: %r\n%s"
                  % (TOTAL_STEPS, timeout, result, self.prometheus_log()))

    def prometheus_log(self):
        with open(os.path.join(self.dir, "prometheus.log"), "rb") as f:
            return f.read()[-3000:].decode(errors="replace")

    def flood(self, job, count=100):
        """`count` connections that never send a whole request (every fifth
        sends garbage); the launcher keeps at most 32 and cuts the rest."""
        deadline = time.monotonic() + 20
        while True:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                break
            except OSError:
                self.assertLess(time.monotonic(), deadline, "the endpoint never listened")
                self.assertIsNone(job.poll(), "the launcher ended early")
                time.sleep(0.05)
        socks = []
        for i in range(count):
            s = socket.create_connection(("127.0.0.1", self.port), timeout=2)
            if i % 5 == 0:
                s.sendall(b"\x16\x03\x01 garbage \xff")
            socks.append(s)
        return socks

    def test_scraped_checked_and_queried(self):
        job = self.start()
        try:
            idle = self.flood(job)
            # Answered again once the idle ones pass the 5 s read deadline.
            text = self.scrape_until_done(job)
            for s in idle:
                s.close()
            self.check_values(text)
            self.promtool_check(text)
            result = self.query_prometheus()
            for series in result:
                self.assertEqual(series["metric"]["job"], "dslaunch")
                self.assertEqual(series["metric"]["instance"], "127.0.0.1:%d" % self.port)
        finally:
            open(self.stop_file, "w").close()
            out, err = job.communicate(timeout=60)
        self.assertEqual(job.returncode, 0, err.decode())
        self.assertIn("metrics on %s" % self.url, err.decode() + out.decode())
        with self.assertRaises(ConnectionRefusedError):
            socket.create_connection(("127.0.0.1", self.port), timeout=2).close()

    def listeners(self, port):
        """The addresses listening on TCP `port`, from /proc/net/tcp{,6}."""
        found = set()
        for name, width in (("/proc/net/tcp", 8), ("/proc/net/tcp6", 32)):
            try:
                with open(name) as f:
                    lines = f.read().splitlines()[1:]
            except OSError:
                continue
            for line in lines:
                fields = line.split()
                addr, hexport = fields[1].split(":")
                if fields[3] != "0A" or int(hexport, 16) != port:
                    continue
                if width == 8:
                    found.add(socket.inet_ntoa(bytes.fromhex(addr)[::-1]))
                else:
                    raw = b"".join(bytes.fromhex(addr[i:i + 8])[::-1] for i in range(0, 32, 8))
                    found.add(socket.inet_ntop(socket.AF_INET6, raw))
        return found

    def test_all_local_job_serves_metrics_on_loopback_only(self):
        # No --metrics_addr: where the control server listens, which for a
        # job whose nodes are all this machine is loopback, not 0.0.0.0.
        job = self.start_job([DSLAUNCH, "--launcher", "local", "--num_gpus", "1",
                              "--log_level", "info", "--metrics_port", str(self.port),
                              "--no_python", self.script], STOP_FILE=self.stop_file)
        try:
            deadline = time.monotonic() + 20
            while not self.listeners(self.port):
                self.assertLess(time.monotonic(), deadline, "the endpoint never listened")
                self.assertIsNone(job.poll(), "the launcher ended early")
                time.sleep(0.05)
            self.assertEqual(self.listeners(self.port), {"127.0.0.1"})
            self.assertEqual(http_get(self.url)[0], 200)
        finally:
            open(self.stop_file, "w").close()
            out, err = job.communicate(timeout=60)
        self.assertEqual(job.returncode, 0, err.decode())

    def test_busy_port_is_a_start_error(self):
        with socket.socket() as held:
            held.bind(("127.0.0.1", self.port))
            held.listen()
            p = self.run_job([DSLAUNCH, "--launcher", "local", "--num_gpus", "1",
                              "--metrics_port", str(self.port), "--metrics_addr", "127.0.0.1",
                              "--no_python", self.script], STOP_FILE=self.stop_file)
        self.assertEqual(p.returncode, 69, p.stderr.decode())
        self.assertIn("127.0.0.1:%d" % self.port, p.stderr.decode())
        self.assertEqual(self.started_pids(), [])


if __name__ == "__main__":
    unittest.main()
