"""Nothing of a job outlives it: a rank's setsid grandchildren, background
children and double-forked daemons are gone after the job, whether it
succeeded or failed, with a cgroup (as root here) and without one (as an
unprivileged user: the agent's subreaper walk); with a cgroup also after the
agent itself is SIGKILLed (without one too, with the local starter, whose
launcher is a subreaper). And a rank cannot read its agent's memory."""
import json
import os
import pwd
import signal
import stat
import subprocess
import time
import unittest

from harness import DSLAUNCH, PY, LaunchTest

ESCAPE_PY = os.path.join(os.path.dirname(os.path.abspath(__file__)), "escape_rank.py")
NAMES = ("setsid", "background", "daemon")
SYSTEM_PY = "/usr/bin/python3"


def job_cgroups():
    """The dsl-* cgroups below this process's cgroup v2 (agents started here
    inherit it), found through /proc/self/mountinfo."""
    mount = None
    with open("/proc/self/mountinfo") as f:
        for line in f:
            fields = line.split()
            sep = fields.index("-")
            if fields[sep + 1] == "cgroup2" and fields[3] == "/":
                mount = fields[4]
    if mount is None:
        return set()
    with open("/proc/self/cgroup") as f:
        own = [l[3:].strip() for l in f if l.startswith("0::")][0]
    base = mount + ("" if own == "/" else own)
    return {d for d in os.listdir(base) if d.startswith("dsl-")}


def world_reachable(path, mode_bit):
    """True when any user may reach `path` (o+x on every parent directory)
    and has `mode_bit` (e.g. stat.S_IXOTH) on it."""
    path = os.path.realpath(path)
    if not os.stat(path).st_mode & mode_bit:
        return False
    parent = os.path.dirname(path)
    while True:
        if not os.stat(parent).st_mode & stat.S_IXOTH:
            return False
        if parent == "/":
            return True
        parent = os.path.dirname(parent)


def nobody_ids():
    try:
        pw = pwd.getpwnam("nobody")
        return pw.pw_uid, pw.pw_gid
    except KeyError:
        return None


class DescendantsTest(LaunchTest):
    def setUp(self):
        super().setUp()
        self.recorded = []
        # Readable and writable for an unprivileged job too.
        os.chmod(self.dir, 0o755)
        os.chmod(self.out, 0o777)

    def tearDown(self):
        for pid in self.recorded:  # only what our own ranks recorded
            if self.alive(pid):
                os.kill(pid, signal.SIGKILL)
        super().tearDown()

    def as_nobody(self, argv):
        ids = nobody_ids()
        if os.geteuid() != 0 or ids is None or not os.access(SYSTEM_PY, os.X_OK):
            self.skipTest("needs root, a 'nobody' user and %s to run a job "
                          "unprivileged" % SYSTEM_PY)
        if not (world_reachable(DSLAUNCH, stat.S_IXOTH) and
                world_reachable(ESCAPE_PY, stat.S_IROTH)):
            self.skipTest("the build tree is not reachable by other users")
        return ["setpriv", "--reuid=%d" % ids[0], "--regid=%d" % ids[1],
                "--clear-groups", *argv]

    def job_args(self, *rank_args, nodes=2, slots=1, unprivileged=False):
        # An unprivileged job needs a Python any user may run.
        py = SYSTEM_PY if unprivileged else PY
        return self.args(nodes, slots) + [py, ESCAPE_PY, *rank_args]

    def descendants(self, ranks):
        pids = []
        for r in range(ranks):
            with open(os.path.join(self.out, "desc-%d.json" % r)) as f:
                d = json.load(f)
            pids += [d[n] for n in NAMES]
        self.recorded += pids
        return pids

    def assert_gone(self, pids, within=5.0):
        deadline = time.monotonic() + within
        while True:
            left = [p for p in pids if self.alive(p)]
            if not left:
                return
            if time.monotonic() > deadline:
                self.fail("descendants left running after the job: %s" % left)
            time.sleep(0.05)

    def run_escape(self, code, unprivileged=False):
        argv = self.job_args("escape", str(code), unprivileged=unprivileged)
        if unprivileged:
            argv = self.as_nobody(argv)
        p = self.run_job(argv, HOME=self.dir)
        pids = self.descendants(2)
        self.assertEqual(len(pids), 6)
        return p, pids

    def test_nothing_outlives_a_successful_job(self):
        p, pids = self.run_escape(0)
        self.assertEqual(p.returncode, 0, p.stderr.decode())
        self.assert_gone(pids)

    def test_nothing_outlives_a_failed_job(self):
        p, pids = self.run_escape(3)
        self.assertEqual(p.returncode, 3, p.stderr.decode())
        self.assert_gone(pids)

    def test_nothing_outlives_a_job_without_a_cgroup(self):
        # Unprivileged: no writable cgroup, so the subreaper walk does it.
        p, pids = self.run_escape(0, unprivileged=True)
        self.assertEqual(p.returncode, 0, p.stderr.decode())
        self.assert_gone(pids)

    def wait_for(self, path, proc, timeout=20):
        deadline = time.monotonic() + timeout
        while not os.path.exists(path):
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                self.fail("%s never appeared: %s" % (path, proc.communicate()[1].decode()))
            time.sleep(0.02)

    def kill_agent_mid_job(self, argv, cgroup=False):
        """Starts a one-node job whose rank leaves escaped descendants,
        SIGKILLs the agent once they run, and asserts that the job fails and
        that the rank and every descendant are gone; with `cgroup`, also that
        the agent's job cgroup (dsl-<job>-<node>-<agent pid>) was there and is
        gone (other suites' jobs may make and remove their own meanwhile)."""
        proc = self.start_job(argv, HOME=self.dir)
        self.wait_for(os.path.join(self.out, "desc-0.json"), proc)
        pids = self.descendants(1)
        rank = self.started_pids()[0]
        with open("/proc/%d/stat" % rank) as f:
            agent = int(f.read().rsplit(")", 1)[1].split()[1])
        ours = lambda: [c for c in job_cgroups() if c.endswith("-%d" % agent)]
        if cgroup:
            self.assertEqual(len(ours()), 1, "no job cgroup of agent %d" % agent)
        os.kill(agent, signal.SIGKILL)
        try:
            proc.communicate(timeout=30)
        finally:
            proc.kill()
        self.assertNotEqual(proc.returncode, 0)
        self.assert_gone(pids + [rank])
        if cgroup:
            self.assertEqual(ours(), [], "the job's cgroup was left behind")

    def test_nothing_outlives_an_agent_killed_with_sigkill(self):
        # With a cgroup (root here): the agent's guard empties it.
        if not os.access("/sys/fs/cgroup", os.W_OK) or os.geteuid() != 0:
            self.skipTest("needs a writable cgroup v2 hierarchy")
        self.kill_agent_mid_job(self.job_args("escape", "hang", nodes=1), cgroup=True)

    def test_nothing_outlives_an_agent_killed_without_a_cgroup(self):
        # Unprivileged, no cgroup: the ranks die with their agent
        # (PR_SET_PDEATHSIG); what left the agent's reach before (setsid
        # grandchildren, daemons, background children) is re-parented to the
        # launcher, a subreaper with the local starter, which kills it. (On a
        # remote node without a cgroup that part survives: docs/decisions.md.)
        self.kill_agent_mid_job(
            self.as_nobody(self.job_args("escape", "hang", nodes=1, unprivileged=True)))

    def test_rank_cannot_read_its_agents_memory_or_environment(self):
        # As an unprivileged user: root could read any process anyway.
        p = self.run_job(self.as_nobody(self.job_args("peek", nodes=1, unprivileged=True)), HOME=self.dir)
        self.assertEqual(p.returncode, 0, p.stderr.decode())
        with open(os.path.join(self.out, "peek-0.json")) as f:
            peek = json.load(f)
        self.assertNotEqual(peek["uid"], 0)
        self.assertEqual(peek["mem"], "EACCES", peek)
        self.assertEqual(peek["environ"], "EACCES", peek)
        self.assertEqual(peek["launcher_environ"], "EACCES", peek)


if __name__ == "__main__":
    unittest.main()
