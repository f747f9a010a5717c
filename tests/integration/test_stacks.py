"""Stacks of a hung rank (issue 12): with --hang_timeout the launcher names a
rank that sent no progress record for that long and asks its agent for its
stacks (CollectStacks); the agent runs eu-stack or gdb (py-spy for a Python
rank when installed) on the rank without stopping it for long, and the
launcher shows the first lines and keeps all of them in
<log_dir>/stacks-rank-<r>.txt. Without any stack tool the agent says which
to install. Needs elfutils (eu-stack) or gdb for the first test, and py-spy
(deploy/setup.sh --test puts it in /opt/dslaunch-test/pyspy-venv) for the
Python frames of the third.
"""
import os
import shutil
import sys
import unittest

from harness import DSLAUNCH, LaunchTest

# Sleeps without a progress record: a hang to --hang_timeout 1.
SLEEPER = "import time; time.sleep(6)"
# The same hang inside a named function, for py-spy's Python frames.
NAMED_SLEEPER = ("import time\n"
                 "def waiting_for_the_allreduce():\n"
                 "    time.sleep(6)\n"
                 "waiting_for_the_allreduce()\n")
PYSPY_BIN = os.path.join(
    os.environ.get("DSL_PYSPY_VENV", "/opt/dslaunch-test/pyspy-venv"), "bin")


class StacksTest(LaunchTest):
    def job(self, *extra, program=SLEEPER):
        return [DSLAUNCH, "--launcher", "local", "--num_gpus", "2",
                "--hang_timeout", "1", *extra,
                "--no_local_rank", "--no_python", sys.executable, "-c", program]

    def test_the_stacks_of_a_hung_rank_reach_the_log_dir(self):
        if not (shutil.which("eu-stack") or shutil.which("gdb")):
            self.skipTest("neither eu-stack (elfutils) nor gdb is installed")
        logs = os.path.join(self.dir, "logs")
        p = self.run_job(self.job("--log_dir", logs), timeout=60)
        out = (p.stdout + p.stderr).decode(errors="replace")
        self.assertEqual(p.returncode, 0, out[-4000:])  # --on_hang warn
        self.assertRegex(out, r"stacks of rank 0 \((eu-stack|gdb|py-spy)\)")
        self.assertRegex(out, r"stacks of rank 1 \((eu-stack|gdb|py-spy)\)")
        for rank in (0, 1):
            with open(os.path.join(logs, "stacks-rank-%d.txt" % rank)) as f:
                text = f.read()
            # A frame of each kind of tool's output.
            self.assertRegex(text, r"#0 |Thread |\(python", text[:2000])

    def test_a_python_rank_gets_its_python_frames_from_py_spy(self):
        spy = os.path.join(PYSPY_BIN, "py-spy")
        if not os.access(spy, os.X_OK):
            msg = "py-spy is not installed in %s (deploy/setup.sh --test)" % PYSPY_BIN
            if os.environ.get("CI"):
                self.fail(msg)
            self.skipTest(msg)
        logs = os.path.join(self.dir, "logs")
        p = self.run_job(self.job("--log_dir", logs, program=NAMED_SLEEPER),
                         timeout=60, PATH=PYSPY_BIN + os.pathsep + os.environ["PATH"])
        out = (p.stdout + p.stderr).decode(errors="replace")
        self.assertEqual(p.returncode, 0, out[-4000:])
        for rank in (0, 1):
            self.assertIn("stacks of rank %d (py-spy)" % rank, out)
            with open(os.path.join(logs, "stacks-rank-%d.txt" % rank)) as f:
                text = f.read()
            # py-spy's own lines: the interpreter, then the function the rank
            # is stuck in, with its line in the -c program.
            self.assertRegex(text, r"Python v3\.\d+", text[:2000])
            self.assertRegex(text, r"waiting_for_the_allreduce \(<string>:3\)", text[:2000])

    def test_without_a_stack_tool_the_agent_says_what_to_install(self):
        empty = os.path.join(self.dir, "no-tools")
        os.mkdir(empty)
        p = self.run_job(self.job(), timeout=60, PATH=empty)
        out = (p.stdout + p.stderr).decode(errors="replace")
        self.assertEqual(p.returncode, 0, out[-4000:])
        self.assertIn("no stack tool found (install elfutils or gdb)", out)


if __name__ == "__main__":
    unittest.main()
