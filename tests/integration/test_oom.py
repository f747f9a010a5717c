"""A rank the kernel's OOM killer ends is reported as such (issue 12): the
agent matches the unexplained SIGKILL to the kernel log (/dev/kmsg) or to the
oom_kill counter of the job's cgroup (memory.events), and the launcher says
the rank ran out of memory and exits 137.

Needs root and a memory controller: a fresh cgroup v2 (memory.max 64M,
memory.swap.max 0) holds the whole job. Where cgroup v2 has no memory
controller (a hybrid hierarchy), a cgroup v1 memory group is used instead
(memory.limit_in_bytes), and then the agent can only tell by /dev/kmsg.
Skips itself with a message otherwise. Only processes inside the test's own
fresh cgroup are ever killed, and the cgroup is always removed.
"""
import os
import re
import signal
import subprocess
import sys
import time
import unittest
import uuid

from harness import DSLAUNCH, LaunchTest

LIMIT = 64 << 20
# Touches 512 MiB (bytes * n writes every page), over and over.
ALLOC = ("import time\n"
         "while True:\n"
         "    hold = [b'x' * (64 << 20) for _ in range(8)]\n"
         "    del hold\n")


def cgroup2_mount():
    with open("/proc/self/mountinfo") as f:
        for line in f:
            fields = line.split()
            sep = fields.index("-")
            if fields[sep + 1] == "cgroup2":
                return fields[4]
    return None


def v1_memory_dir():
    """This process's cgroup v1 memory directory, or None."""
    with open("/proc/self/cgroup") as f:
        for line in f:
            _, controllers, path = line.rstrip("\n").split(":", 2)
            if "memory" in controllers.split(","):
                d = "/sys/fs/cgroup/memory" + path
                return d if os.path.isdir(d) else None
    return None


def write(path, text):
    with open(path, "w") as f:
        f.write(text)


def members(cg):
    """Pids in `cg` and every cgroup below it."""
    pids = []
    for root, _, files in os.walk(cg):
        if "cgroup.procs" in files:
            with open(os.path.join(root, "cgroup.procs")) as f:
                pids += [int(p) for p in f.read().split()]
    return pids


def remove_cgroup(cg):
    """Kills what is left in our own cgroup `cg` (by pid, nothing else) and
    removes it with its children, deepest first."""
    deadline = time.monotonic() + 10
    while True:
        pids = members(cg)
        if not pids:
            break
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        if time.monotonic() > deadline:
            break
        time.sleep(0.05)
    for root, dirs, _ in sorted(os.walk(cg), key=lambda w: -w[0].count("/")):
        for _ in range(100):
            try:
                os.rmdir(root)
                break
            except FileNotFoundError:
                break
            except OSError:
                time.sleep(0.05)


class OomTest(LaunchTest):
    def setUp(self):
        super().setUp()
        if os.geteuid() != 0:
            self.skipTest("needs root (makes a memory cgroup)")
        self.cg = None
        name = "dsl-oom-test-" + uuid.uuid4().hex[:12]
        mount = cgroup2_mount()
        controllers = ""
        if mount and os.path.exists(os.path.join(mount, "cgroup.controllers")):
            with open(os.path.join(mount, "cgroup.controllers")) as f:
                controllers = f.read()
        if "memory" in controllers.split():
            self.make_v2(mount, name)
        elif v1_memory_dir() and os.access("/dev/kmsg", os.R_OK):
            self.make_v1(v1_memory_dir(), name)
        else:
            self.skipTest("no cgroup v2 memory controller (and no cgroup v1 "
                          "memory group with a readable /dev/kmsg)")

    def make_v2(self, mount, name):
        # The parent hands the memory controller to its children (left on
        # afterwards: others may rely on it).
        with open(os.path.join(mount, "cgroup.subtree_control")) as f:
            if "memory" not in f.read().split():
                write(os.path.join(mount, "cgroup.subtree_control"), "+memory")
        self.cg = os.path.join(mount, name)
        os.mkdir(self.cg)
        self.addCleanup(remove_cgroup, self.cg)
        write(os.path.join(self.cg, "memory.max"), str(LIMIT))
        if os.path.exists(os.path.join(self.cg, "memory.swap.max")):
            write(os.path.join(self.cg, "memory.swap.max"), "0")

    def make_v1(self, parent, name):
        self.cg = os.path.join(parent, name)
        os.mkdir(self.cg)
        self.addCleanup(remove_cgroup, self.cg)
        write(os.path.join(self.cg, "memory.limit_in_bytes"), str(LIMIT))
        memsw = os.path.join(self.cg, "memory.memsw.limit_in_bytes")
        if os.path.exists(memsw):
            write(memsw, str(LIMIT))
        write(os.path.join(self.cg, "memory.swappiness"), "0")

    def test_a_rank_killed_by_the_oom_killer_is_reported(self):
        job = [DSLAUNCH, "--launcher", "local", "--num_gpus", "2",
               "--no_local_rank", "--no_python", sys.executable, "-c", ALLOC]
        # The wrapper joins the cgroup, then becomes dslaunch: the launcher,
        # its agent and the ranks all live in it.
        argv = ["sh", "-c", 'echo $$ > "$0/cgroup.procs" && exec "$@"',
                self.cg] + job
        p = self.run_job(argv, timeout=120)
        out = (p.stdout + p.stderr).decode(errors="replace")
        self.assertEqual(p.returncode, 137, out[-4000:])
        # The launcher's own report line, not only the agent's log.
        self.assertRegex(out, re.compile(r"^dslaunch:.*oom", re.I | re.M),
                         out[-4000:])
        # What was on its way out when the launcher exited (a helper the
        # agent's end killed) has a moment to be reaped, as in every other
        # test's leftover check; anything that stays is a leftover.
        deadline = time.monotonic() + 5
        while members(self.cg) and time.monotonic() < deadline:
            time.sleep(0.05)
        left = {}
        for pid in members(self.cg):
            try:
                with open("/proc/%d/cmdline" % pid, "rb") as f:
                    left[pid] = f.read()[:120]
            except OSError:
                pass  # gone meanwhile
        self.assertEqual(left, {}, "processes left in the cgroup")


if __name__ == "__main__":
    unittest.main()
