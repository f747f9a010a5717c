"""dslaunch's Python client (python/dslaunch, pure Python): a rank's
report() records reach metrics.jsonl as it sent them, and dslaunch.store is
the job's store across ranks (set, get that waits, add, wait, check, a
timeout, a refusal); outside dslaunch both are no-ops with one warning."""
import json
import os
import subprocess
import sys
import unittest

from harness import LaunchTest

HERE = os.path.dirname(os.path.abspath(__file__))
CLIENT = os.path.join(HERE, "..", "..", "python")
RANK = os.path.join(HERE, "py_client_rank.py")


class PythonClient(LaunchTest):
    def test_records_and_the_store_across_three_ranks(self):
        logs = os.path.join(self.dir, "logs")
        p = self.run_job(self.args(nodes=1, slots=3) +
                         ["--log_dir", logs, sys.executable, RANK],
                         timeout=60, DSLAUNCH_PY_CLIENT=CLIENT)
        self.assertEqual(p.returncode, 0, p.stderr.decode())
        seen = []
        for r in range(3):
            with open(os.path.join(self.out, "py-%d.json" % r)) as f:
                got = json.load(f)
            self.assertEqual(got["sent"], [True, True, True])
            self.assertEqual(got["values"], ["hello 0", "hello 1", "hello 2"])
            self.assertTrue(got["timed_out"])
            self.assertTrue(got["checked"])
            self.assertFalse(got["absent"])
            self.assertIn("r0", got["refused"])
            self.assertTrue(got["in_dslaunch"])
            seen.append(got["count"])
        self.assertEqual(sorted(seen), [1, 2, 3])  # each add saw the others'
        with open(os.path.join(logs, "metrics.jsonl")) as f:
            records = [json.loads(line) for line in f if '"step"' in line]
        for r in range(3):
            mine = [x for x in records if x.get("rank") == r]
            self.assertEqual([x["step"] for x in mine], [1, 2, 3, 4], mine)
            self.assertEqual([x["loss"] for x in mine[:3]], [1.0, 0.5, 1.0 / 3])
            self.assertEqual(mine[0]["tokens_per_s"], 100.0 * (r + 1))
            self.assertEqual(mine[3]["loss"], "NaN")

    def test_outside_dslaunch_everything_is_a_no_op_said_once(self):
        code = ("import sys, warnings; sys.path.insert(0, %r); import dslaunch\n"
                "warnings.simplefilter('always')\n"
                "print(dslaunch.report(step=1, loss=2.0), dslaunch.report(step=2),\n"
                "      dslaunch.store.get('x'), dslaunch.store.set('x', 'y'),\n"
                "      dslaunch.store.add('n'), dslaunch.in_dslaunch())" % CLIENT)
        env = {k: v for k, v in os.environ.items() if not k.startswith("DSLAUNCH_")}
        p = subprocess.run([sys.executable, "-c", code], capture_output=True, env=env,
                           timeout=30)
        self.assertEqual(p.returncode, 0, p.stderr.decode())
        self.assertEqual(p.stdout.decode().split(), ["False", "False", "None", "None",
                                                     "None", "False"])
        err = p.stderr.decode()
        self.assertEqual(err.count("report() outside dslaunch"), 1, err)
        self.assertEqual(err.count("dslaunch.store used outside dslaunch"), 1, err)


if __name__ == "__main__":
    unittest.main()
