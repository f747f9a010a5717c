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
import json
import os
import shutil
import sys
import time
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


# A fake stack tool (named py-spy and eu-stack, first on PATH) that records
# where it runs: its parent (the process that may trace the ranks) and that
# one's parent, and the ancestors of the rank it was asked about.
RECORDING_TOOL = """#!%(python)s
import json, os, sys

def parent(pid):
    with open("/proc/%%d/status" %% pid) as f:
        for line in f:
            if line.startswith("PPid:"):
                return int(line.split()[1])

def command(pid):
    with open("/proc/%%d/cmdline" %% pid, "rb") as f:
        return f.read().decode(errors="replace").split("\\0")[:-1]

args = sys.argv[1:]
rank = int(args[args.index("--pid" if "--pid" in args else "-p") + 1])
ancestors, p = [], rank
while p > 1:
    p = parent(p)
    ancestors.append(p)
tool_parent = os.getppid()
record = {"tool_parent": tool_parent, "tool_parent_cmd": command(tool_parent),
          "helper_parent": parent(tool_parent), "rank": rank,
          "rank_ancestors": ancestors,
          "helper_parent_cmd": command(parent(tool_parent))}
with open(os.path.join(%(out)r, "tool-%%d.json" %% rank), "w") as f:
    json.dump(record, f)
print("#0  0x0000 in fake_frame ()")
"""


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

    def test_the_stack_tool_runs_under_the_helper_that_no_rank_descends_from(self):
        # Under Yama's ptrace_scope 1 a rank's declared tracer (PR_SET_PTRACER)
        # and its descendants may trace it. The ranks name the stack helper, a
        # child of the agent: ranks (the agent's children too) do not descend
        # from it, so they cannot trace each other; its tools do.
        tools = os.path.join(self.dir, "tools")
        os.mkdir(tools)
        for name in ("py-spy", "eu-stack"):
            path = os.path.join(tools, name)
            with open(path, "w") as f:
                f.write(RECORDING_TOOL % {"python": sys.executable, "out": self.out})
            os.chmod(path, 0o755)
        p = self.run_job(self.job(), timeout=60,
                         PATH=tools + os.pathsep + os.environ["PATH"])
        out = (p.stdout + p.stderr).decode(errors="replace")
        self.assertEqual(p.returncode, 0, out[-4000:])
        records = []
        for name in sorted(os.listdir(self.out)):
            if name.startswith("tool-"):
                with open(os.path.join(self.out, name)) as f:
                    records.append(json.load(f))
        self.assertEqual(len(records), 2, out[-4000:])  # one per rank
        helpers = {r["tool_parent"] for r in records}
        self.assertEqual(len(helpers), 1, records)  # one helper per node
        helper = helpers.pop()
        for r in records:
            self.assertEqual(r["tool_parent_cmd"][1:], ["--stack_helper"], r)
            agent = r["helper_parent"]
            self.assertTrue(os.path.basename(r["helper_parent_cmd"][0]) == "dsagent"
                            and "--stack_helper" not in r["helper_parent_cmd"], r)
            # The rank is the agent's child, and not below the helper.
            self.assertEqual(r["rank_ancestors"][0], agent, r)
            self.assertNotIn(helper, r["rank_ancestors"], r)
        # The helper ended with its agent (zombies count as gone).
        deadline = time.monotonic() + 5
        while self.alive(helper) and time.monotonic() < deadline:
            time.sleep(0.05)
        self.assertFalse(self.alive(helper), "the stack helper outlived the job")
        # The fake's frames reached the console.
        self.assertRegex(out, r"stacks of rank 0 \((py-spy|eu-stack)\)")
        self.assertIn("fake_frame", out)

    def test_without_a_stack_tool_the_agent_says_what_to_install(self):
        empty = os.path.join(self.dir, "no-tools")
        os.mkdir(empty)
        p = self.run_job(self.job(), timeout=60, PATH=empty)
        out = (p.stdout + p.stderr).decode(errors="replace")
        self.assertEqual(p.returncode, 0, out[-4000:])
        self.assertIn("no stack tool found (install elfutils or gdb)", out)


if __name__ == "__main__":
    unittest.main()
