"""The launcher's key/value store under a rank that stores far more than the
job's quota: the rank gets an error naming the limit, the launcher's memory
stays bounded, and the job goes on and succeeds."""
import os
import time
import unittest

from harness import DSLAUNCH, LaunchTest

PROBE = os.path.join(os.path.dirname(DSLAUNCH), "store_probe")
FLOOD_MIB = 320           # five times the default 64 MiB quota
RSS_LIMIT_MIB = 160       # quota + the launcher's own few tens of MiB


def status_mib(pid, field):
    with open("/proc/%d/status" % pid) as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024.0
    raise AssertionError("no %s for pid %d" % (field, pid))


class StoreQuota(LaunchTest):
    def test_rank_flooding_the_store_is_refused_and_the_job_stays_healthy(self):
        p = self.start_job(self.args(nodes=2, slots=1) +
                           [PROBE, "flood", str(FLOOD_MIB), self.out])
        try:
            flooded = os.path.join(self.out, "flooded")
            deadline = time.monotonic() + 60
            while not os.path.exists(flooded):
                self.assertIsNone(p.poll(), "job ended before the flood was done")
                self.assertLess(time.monotonic(), deadline, "flood did not finish")
                time.sleep(0.05)
            rss, peak = status_mib(p.pid, "VmRSS"), status_mib(p.pid, "VmHWM")
            with open(os.path.join(self.out, "go"), "w"):
                pass
            out, err = p.communicate(timeout=60)
        finally:
            if p.poll() is None:
                p.kill()
                p.wait()
        out, err = out.decode(), err.decode()
        self.assertEqual(p.returncode, 0, err)
        self.assertIn("store limit: storing key 'flood/", out)
        self.assertIn("over the job's quota of 64 MiB", out)
        for r in range(2):
            self.assertIn("store ok %d arrived=" % r, out)
        self.assertLess(rss, RSS_LIMIT_MIB, "launcher VmRSS %.0f MiB" % rss)
        self.assertLess(peak, RSS_LIMIT_MIB, "launcher VmHWM %.0f MiB" % peak)


if __name__ == "__main__":
    unittest.main()
