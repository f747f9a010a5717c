"""--launcher join across pods simulated as the platform makes them (pods.sh):
four worker pods, each a network namespace on a bridge with its own hostname
(train-worker-I), a read-only / and a private TMPDIR, run as UID 100000+I,
GID 0, without a passwd entry, HOME or sshd; the launcher runs in a pod of its
own as UID 100999 and the agents dial its Service name, dslaunch-launcher.
Needs root; skips itself with a message otherwise (fails under CI=1). Every
test checks that nothing of the job is left in any pod afterwards."""
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

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "../integration"))
import soak_restarts  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
PODS_SH = os.path.join(HERE, "pods.sh")
POD_RANK = os.path.join(HERE, "pod_rank.py")
BIN = os.environ.get("DSL_BIN", os.path.join(HERE, "../../build/bin"))
# The pods' interpreter: every UID can run it (pyenv's lives under /root).
POD_PY = "/usr/bin/python3"
WORKERS = 4  # pod 3 is the spare: the duplicate and the wrong secret come from it
UID_BASE = 100000
PODS = {}


def setUpModule():
    if os.geteuid() != 0:
        skip_or_fail("the pod tests need root (network, UTS and mount namespaces)")
    # A parent every UID may traverse: the pods read the secret and binaries in it.
    parent = tempfile.mkdtemp(prefix="dsl-pods-")
    os.chmod(parent, 0o755)
    PODS["parent"] = parent
    d = os.path.join(parent, "p")
    p = subprocess.run([PODS_SH, "up", str(WORKERS), d], capture_output=True, timeout=120,
                       env=dict(os.environ, PODS_BIN=BIN))
    if p.returncode == 77:
        shutil.rmtree(parent, ignore_errors=True)
        skip_or_fail("cannot simulate pods here: " + p.stderr.decode())
    if p.returncode != 0:
        shutil.rmtree(parent, ignore_errors=True)
        raise RuntimeError("pods.sh up failed:\n" + p.stderr.decode())
    for line in p.stdout.decode().splitlines():
        key, _, value = line.partition("=")
        PODS[key] = value.strip('"')


def skip_or_fail(why):
    if os.environ.get("CI"):
        raise RuntimeError(why + " (CI is set: not skipping)")
    raise unittest.SkipTest(why)


def tearDownModule():
    if "PODS_DIR" in PODS:
        subprocess.run([PODS_SH, "down", PODS["PODS_DIR"]], timeout=120)
    if "parent" in PODS:
        shutil.rmtree(PODS["parent"], ignore_errors=True)


def pod_tmp(pod):
    return os.path.join(PODS["PODS_DIR"], "pod-%s" % ("L" if pod == "launcher" else pod), "tmp")


def pod_addr(pod):
    """Worker pod I's address: 10.214.X.(I+1) (the launcher's is 10.214.X.250)."""
    return "%s.%d" % (PODS["PODS_LAUNCHER_ADDR"].rsplit(".", 1)[0], pod + 1)


def alive(pid):
    try:
        with open("/proc/%d/stat" % pid) as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except (FileNotFoundError, ProcessLookupError):
        return False


class PodTest(unittest.TestCase):
    def setUp(self):
        self.procs = []
        self.volume = PODS["PODS_VOLUME"]
        self.secret = PODS["PODS_SECRET"]
        self.assertEqual(self.pod_pids(), {}, "pods not empty before the test")

    def tearDown(self):
        # What a test did not wait for (it failed before) is deleted as the
        # kubelet deletes a pod: SIGTERM, then SIGKILL after a grace period.
        for p in self.procs:
            if p.poll() is None:
                p.terminate()
                try:
                    p.communicate(timeout=5)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.communicate()
        try:
            self.assert_pods_empty(within=10)
        finally:
            for pod in ["launcher"] + list(range(WORKERS)):
                self.empty_dir(pod_tmp(pod))
            self.empty_dir(self.volume)

    @staticmethod
    def empty_dir(path):
        for name in os.listdir(path):
            entry = os.path.join(path, name)
            if os.path.isdir(entry) and not os.path.islink(entry):
                shutil.rmtree(entry)  # a SIGKILLed agent's run directory
            else:
                os.unlink(entry)

    # ------------------------------------------------------------ the pods
    def run_in_pod(self, pod, argv, *opts):
        p = subprocess.Popen([PODS_SH, "run", PODS["PODS_DIR"], str(pod), *opts, "--", *argv],
                             stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE)
        p.pod, p.what, p.seen = pod, os.path.basename(argv[0]), b""
        self.procs.append(p)
        return p

    def launcher(self, nodes, *extra, program=("record",)):
        argv = [os.path.join(PODS["PODS_BIN"], "dslaunch"), "--launcher", "join",
                "--num_nodes", str(nodes), "--num_gpus", "2", "--secret_file", self.secret,
                "--no_local_rank", "--env", "OUT_DIR=" + self.volume, *extra,
                POD_PY, POD_RANK, *program]
        return self.run_in_pod("launcher", argv)

    def agent(self, pod, *opts, extra=(), secret=None):
        """dsagent in `pod` as its container command; `opts` are pods.sh run's
        (--index K, --no-index)."""
        argv = [os.path.join(PODS["PODS_BIN"], "dsagent"),
                "--join", "%s:29400" % PODS["PODS_LAUNCHER"],
                "--secret_file", secret or self.secret, *extra]
        return self.run_in_pod(pod, argv, *opts)

    def finish(self, proc, timeout=30):
        """(exit status, stdout, stderr) of `proc`, stderr including what
        read_until took from it."""
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, err = proc.communicate()
            self.fail("%s in pod %s did not end within %g s; it wrote:\n%s" % (
                proc.what, proc.pod, timeout, (proc.seen + err).decode()[-3000:]))
        err = proc.seen + err
        return proc.returncode, out.decode(errors="replace"), err.decode(errors="replace")

    def read_until(self, proc, pattern, timeout=20):
        """Reads `proc`'s stderr until the regex `pattern` matches what was read."""
        rx = re.compile(pattern, re.M)
        deadline = time.monotonic() + timeout
        fd = proc.stderr.fileno()
        while not rx.search(proc.seen.decode(errors="replace")):
            left = deadline - time.monotonic()
            if left <= 0 or (select.select([fd], [], [], left)[0] and not self.read_some(proc)):
                self.fail("no %r from %s in pod %s within %g s; it wrote:\n%s" % (
                    pattern, proc.what, proc.pod, timeout, proc.seen.decode()[-3000:]))

    @staticmethod
    def read_some(proc):
        chunk = os.read(proc.stderr.fileno(), 65536)
        proc.seen += chunk
        return chunk

    def pod_pids(self, pods=None):
        """{pod: [live pids in its network namespace]}, pods with none left out
        (the pause process is not listed)."""
        left = {}
        for pod in pods or ["launcher"] + list(range(WORKERS)):
            p = subprocess.run([PODS_SH, "pids", PODS["PODS_DIR"], str(pod)],
                               capture_output=True, timeout=30)
            # An empty answer from a failed command would read as "nothing left".
            self.assertEqual(p.returncode, 0, p.stderr.decode())
            pids = [int(x) for x in p.stdout.split() if alive(int(x))]
            if pids:
                left[pod] = pids
        return left

    def assert_pods_empty(self, within, pods=None):
        deadline = time.monotonic() + within
        while self.pod_pids(pods):
            if time.monotonic() > deadline:
                left = self.pod_pids(pods)
                desc = {pod: [self.cmdline(x)[:80] for x in pids] for pod, pids in left.items()}
                for pids in left.values():
                    for pid in pids:
                        os.kill(pid, signal.SIGKILL)
                self.fail("processes of the job left in the pods %s" % desc)
            time.sleep(0.05)

    @staticmethod
    def cmdline(pid):
        try:
            with open("/proc/%d/cmdline" % pid, "rb") as f:
                return f.read().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            return ""

    def wait_for(self, what, cond, timeout=20):
        deadline = time.monotonic() + timeout
        while not cond():
            self.assertLess(time.monotonic(), deadline, "no %s within %g s" % (what, timeout))
            time.sleep(0.02)

    # ---------------------------------------------------------- what ran
    def records(self):
        """{rank: (pod, what pod_rank.py saw)} from every pod's TMPDIR."""
        seen = {}
        for pod in range(WORKERS):
            for name in os.listdir(pod_tmp(pod)):
                if name.startswith("rank-") and name.endswith(".json"):
                    with open(os.path.join(pod_tmp(pod), name)) as f:
                        seen[int(name[5:-5])] = (pod, json.load(f))
        return seen

    def started_pids(self):
        pids = []
        for name in os.listdir(self.volume):
            if name.startswith("start-"):
                with open(os.path.join(self.volume, name)) as f:
                    pids.append(int(f.read().split()[1]))
        return pids

    def assert_ranks(self, node_of_pod, world=None):
        """Every rank ran in the pod whose node rank it has, 2 a node, as that
        pod's UID with GID 0 and no passwd entry, under its hostname, in the
        pod's environment; and the job wrote only under TMPDIR."""
        world = world or 2 * len(node_of_pod)
        seen = self.records()
        self.assertEqual(sorted(seen), list(range(world)), "ranks that ran")
        for rank, (pod, r) in seen.items():
            what = "rank %d (in pod %d)" % (rank, pod)
            self.assertEqual(int(r["env"]["NODE_RANK"]), node_of_pod[pod], what)
            self.assertEqual(int(r["env"]["NODE_RANK"]), rank // 2, what)
            self.assertEqual(r["env"]["WORLD_SIZE"], str(world), what)
            self.assertEqual(r["hostname"], "train-worker-%d" % pod, what)
            self.assertEqual((r["uid"], r["euid"], r["gid"]), (UID_BASE + pod,) * 2 + (0,), what)
            self.assertEqual(r["groups"], [], what)
            self.assertFalse(r["passwd_entry"], what)
            self.assertIsNone(r["env"]["HOME"], what)
            self.assertEqual(r["env"]["TMPDIR"], pod_tmp(pod), what)
            self.assertEqual(r["env"]["KUBERNETES_SERVICE_HOST"], "10.96.0.1", what)
            self.assertEqual(r["write_outside_tmpdir"], "EROFS", what)
        self.assert_wrote_only_under_tmpdir(node_of_pod)

    def assert_wrote_only_under_tmpdir(self, pods):
        """Outside the read-only /, a pod's processes can write in its TMPDIR,
        the volume and its own /dev/shm: the agent left nothing in TMPDIR
        (the ready file is gone), the ranks nothing but their records, and
        nothing of the job is in /dev/shm or the volume but the start files."""
        for pod in pods:
            self.assertTrue(all(n.startswith("rank-") for n in os.listdir(pod_tmp(pod))),
                            "pod %d's TMPDIR: %s" % (pod, os.listdir(pod_tmp(pod))))
            shm = "/proc/%s/root/dev/shm" % self.pause_pid(pod)
            self.assertEqual(os.listdir(shm), [], "pod %d's /dev/shm" % pod)
        self.assertTrue(all(n.startswith("start-") for n in os.listdir(self.volume)),
                        os.listdir(self.volume))

    def pause_pid(self, pod):
        with open(os.path.join(PODS["PODS_DIR"], "state")) as f:
            for line in f:
                k, *rest = line.split()
                if k == "pause" and rest[0] == str(pod):
                    return int(rest[1])
        self.fail("no pause process for pod %s" % pod)


class Pods(PodTest):
    def test_the_pods_are_what_the_platform_makes(self):
        # The simulation itself, so that the tests below mean what they say.
        probe = ("import os, socket, pwd, sys; print(os.getuid(), os.getgid(), "
                 "socket.gethostname(), os.environ.get('HOME'), os.environ['TMPDIR'])\n"
                 "try: pwd.getpwuid(os.getuid()); print('passwd')\n"
                 "except KeyError: print('nopasswd')\n"
                 "try: open('/probe', 'w')\nexcept OSError as e: print(e.strerror)\n"
                 "print(sum(l.startswith('Cap') and int(l.split()[1], 16) == 0\n"
                 "          for l in open('/proc/self/status')))")
        for pod in range(WORKERS):
            code, out, err = self.finish(self.run_in_pod(pod, [POD_PY, "-c", probe]))
            self.assertEqual(code, 0, err)
            self.assertEqual(out.split("\n")[:4], [
                "%d 0 train-worker-%d None %s" % (UID_BASE + pod, pod, pod_tmp(pod)),
                "nopasswd", "Read-only file system", "5"])  # all 5 capability sets empty
        # The launcher's Service name resolves; nothing beyond the pods' subnet
        # is reachable (no route: the traffic stays on the bridge).
        code, out, err = self.finish(self.run_in_pod(1, [POD_PY, "-c", (
            "import socket; print(socket.gethostbyname('dslaunch-launcher'))\n"
            "s = socket.socket(); s.settimeout(2)\n"
            "print(s.connect_ex(('10.96.0.1', 443)))")]))
        self.assertEqual(out.split()[0], PODS["PODS_LAUNCHER_ADDR"], err)
        self.assertNotEqual(out.split()[1], "0")
        self.assertEqual(self.pod_pids(), {}, "no sshd or anything else runs in a pod")

    def test_agents_before_the_launcher_in_scrambled_order(self):
        ready = {pod: os.path.join(pod_tmp(pod), "joined") for pod in range(3)}
        agents = {pod: self.agent(pod, extra=["--ready_file", ready[pod]]) for pod in (2, 0, 1)}
        time.sleep(0.5)  # they dial a launcher (and a name) that is not there yet
        for pod, a in agents.items():
            self.assertIsNone(a.poll(), "agent in pod %d gave up" % pod)
        job = self.launcher(3)
        code, _, err = self.finish(job)
        self.assertEqual(code, 0, err)
        self.assertIn("all 3 agents joined: 6 ranks, MASTER_ADDR 10.214.", err)
        for pod, a in agents.items():
            acode, _, aerr = self.finish(a)
            self.assertEqual(acode, 0, "agent in pod %d: %s" % (pod, aerr))
            self.assertFalse(os.path.exists(ready[pod]), "ready file left behind")
        self.assert_ranks({0: 0, 1: 1, 2: 2})

    def test_node_rank_from_job_completion_index(self):
        # The index disagrees with the hostname's -N on purpose: the index wins.
        index = {0: 1, 1: 2, 2: 0}
        job = self.launcher(3)
        agents = [self.agent(pod, "--index", str(index[pod])) for pod in (0, 1, 2)]
        code, _, err = self.finish(job)
        self.assertEqual(code, 0, err)
        for a in agents:
            self.assertEqual(self.finish(a)[0], 0)
        self.assert_ranks(index)

    def test_node_rank_from_the_hostname_without_an_index(self):
        # StatefulSet pods: no JOB_COMPLETION_INDEX, hostname train-worker-N.
        # They join one by one in the order 2, 1, 0, so "first free" would
        # have given pod 2 node rank 0.
        job = self.launcher(3, "--log_level", "info")
        agents = []
        for pod in (2, 1, 0):
            agents.append(self.agent(pod, "--no-index"))
            self.read_until(job, r"node %d \(train-worker-%d\) joined" % (pod, pod))
        code, _, err = self.finish(job)
        self.assertEqual(code, 0, err)
        for a in agents:
            self.assertEqual(self.finish(a)[0], 0)
        self.assert_ranks({0: 0, 1: 1, 2: 2})

    def test_a_rank_failing_in_pod_2_tears_down_every_pod(self):
        job = self.launcher(3, program=("fail", "5", "7"))
        agents = [self.agent(pod) for pod in range(3)]
        code, _, err = self.finish(job)
        ended = time.monotonic()
        self.assertEqual(code, 7, err)
        self.assertIn("rank 5 on train-worker-2", err)
        self.assertEqual(sorted(self.records()), list(range(6)), "every rank had started")
        for pod, a in enumerate(agents):
            acode, _, aerr = self.finish(a, timeout=15)
            self.assertNotEqual(acode, 0, "agent in pod %d: %s" % (pod, aerr))
            self.assertEqual(acode, 7, "agent in pod %d: %s" % (pod, aerr))
        self.assert_pods_empty(within=5)
        self.assertLess(time.monotonic() - ended, 5)
        self.assertEqual([p for p in self.started_pids() if alive(p)], [])

    def test_a_pod_the_platform_restarts_joins_the_next_generation(self):
        job = self.launcher(3, "--max_restarts", "1", "--restart_backoff", "0",
                            program=("later",))
        agents = [self.agent(pod) for pod in range(3)]
        self.wait_for("every rank's start", lambda: len(self.started_pids()) == 6)
        lost = [pid for pid in self.pod_pids([1]).get(1, [])
                if "dsagent" in self.cmdline(pid) and "--join" in self.cmdline(pid)]
        self.assertEqual(len(lost), 1, self.pod_pids([1]))
        os.kill(lost[0], signal.SIGKILL)
        self.finish(agents[1], timeout=15)
        self.read_until(job, r"waiting for node 1 \(train-worker-1\) to join again")
        agents[1] = self.agent(1)  # the pod restarted, as restartPolicy OnFailure does
        code, _, err = self.finish(job, timeout=60)
        self.assertEqual(code, 0, err[-3000:])
        self.assertIn("node 1 (train-worker-1) was lost", err)
        self.assertIn("node 1 (train-worker-1) is back", err)
        self.assertIn("after 1 restart", err)
        for pod, a in enumerate(agents):
            acode, _, aerr = self.finish(a, timeout=15)
            self.assertEqual(acode, 0, "agent in pod %d: %s" % (pod, aerr[-2000:]))
        self.assert_pods_empty(within=5)

    def test_min_pods_start_the_job_and_a_late_pod_grows_it(self):
        """--num_nodes 2:3: pods 0 and 2 join, none other for --join_settle,
        and the job starts on them (node ranks 0 and 1, 4 ranks); pod 1
        comes later, stands by, and the job grows to 3 nodes."""
        job = self.launcher("2:3", "--join_settle", "1", "--max_restarts", "1",
                            "--restart_backoff", "0", program=("later",))
        agents = {pod: self.agent(pod) for pod in (0, 2)}
        self.read_until(job, r"starting with 2 of 3 nodes: no other agent joined for "
                             r"--join_settle 1 s \(missing 1;")
        self.wait_for("the 4 ranks' start", lambda: len(self.started_pids()) == 4)
        agents[1] = self.agent(1)
        code, _, err = self.finish(job, timeout=60)
        self.assertEqual(code, 0, err[-3000:])
        self.assertIn("2 of 3 agents joined: 4 ranks", err)
        self.assertIn("node 1 (train-worker-1) is back", err)
        self.assertIn("node 1 (train-worker-1) stands by: the job grows from 2 to 3 nodes",
                      err)
        self.assertIn("on 3 nodes (train-worker-0, train-worker-1, train-worker-2), 6 ranks "
                      "(was 4)", err)
        self.assertEqual(len(self.started_pids()), 6)  # every rank of both
        for pod, a in agents.items():
            acode, _, aerr = self.finish(a, timeout=15)
            self.assertEqual(acode, 0, "agent in pod %d: %s" % (pod, aerr[-2000:]))
        self.assert_pods_empty(within=5)

    def test_a_missing_pod_is_named_and_the_launcher_exits_69(self):
        job = self.launcher(3, "--join_timeout", "3")
        agents = [self.agent(pod) for pod in (0, 2)]
        code, _, err = self.finish(job, timeout=20)
        self.assertEqual(code, 69, err)
        self.assertRegex(err, r"waiting for agents to join on port 29400: \d of 3 joined, missing ")
        self.assertIn("--join_timeout: no agent joined as node rank 1 within 3 s", err)
        for pod, a in zip((0, 2), agents):
            acode, _, aerr = self.finish(a, timeout=15)
            self.assertEqual(acode, 69, "agent in pod %d: %s" % (pod, aerr))  # the launcher's
            self.assertIn("the job ended before it started: node 1 (join-1) was lost: no agent joined", aerr)
        self.assertEqual(self.records(), {}, "no rank starts before every node joined")

    def test_a_duplicate_and_a_wrong_secret_are_refused_and_the_job_succeeds(self):
        wrong = os.path.join(PODS["PODS_DIR"], "wrong-secret")
        with open(wrong, "w") as f:
            f.write(os.urandom(32).hex() + "\n")
        os.chmod(wrong, 0o440)
        job = self.launcher(3, "--log_level", "info")
        agents = []
        for pod in (0, 1):
            agents.append(self.agent(pod))
            self.read_until(job, r"node %d \(train-worker-%d\) joined" % (pod, pod))
        # Pod 3 claims node rank 0 (held by pod 0), then comes with a wrong secret.
        code, _, err = self.finish(self.agent(3, "--index", "0"))
        self.assertEqual(code, 1, err)
        self.assertIn("refused: node rank 0 is taken by the agent on train-worker-0 (%s)"
                      % pod_addr(0), err)
        code, _, err = self.finish(self.agent(3, "--index", "2", secret=wrong,
                                              extra=["--join_timeout", "3"]))
        self.assertEqual(code, 69, err)
        self.assertIn("launcher failed to prove the job secret", err)
        agents.append(self.agent(2))
        code, _, err = self.finish(job)
        self.assertEqual(code, 0, err)
        for a in agents:
            self.assertEqual(self.finish(a)[0], 0)
        self.assert_ranks({0: 0, 1: 1, 2: 2})

    def test_the_launcher_sigkilled_ends_every_agent_and_rank(self):
        job = self.launcher(3, "--heartbeat_interval", "0.5", "--heartbeat_timeout", "3",
                            program=("sleep",))
        ready = [os.path.join(pod_tmp(pod), "joined") for pod in range(3)]
        agents = [self.agent(pod, extra=["--ready_file", ready[pod]]) for pod in range(3)]
        self.wait_for("6 ranks", lambda: len(self.started_pids()) == 6)
        self.assertTrue(all(os.path.exists(r) for r in ready), "readiness while running")
        # The secret is in no process's argv (nor environment): the
        # launcher's, the agents', the ranks', anything in any pod.
        with open(self.secret) as f:
            secret = f.read().strip().encode()
        pids = [job.pid] + [a.pid for a in agents] + self.started_pids()
        pids += [p for ps in self.pod_pids().values() for p in ps]
        self.assertEqual(self.cmdline(job.pid).split()[0],
                         os.path.join(PODS["PODS_BIN"], "dslaunch"), "the pid is the launcher's")
        for pid in set(pids):
            for what in ("cmdline", "environ"):
                with open("/proc/%d/%s" % (pid, what), "rb") as f:
                    self.assertNotIn(secret, f.read(), "%s of %s" % (what, self.cmdline(pid)))
        ranks = self.started_pids()
        os.kill(job.pid, signal.SIGKILL)
        job.communicate()
        killed = time.monotonic()
        for pod, a in enumerate(agents):
            acode, _, aerr = self.finish(a, timeout=10)
            self.assertEqual(acode, 69, "agent in pod %d: %s" % (pod, aerr))
        # The connection broke at once; at most the heartbeat timeout (3 s).
        self.assertLess(time.monotonic() - killed, 3)
        self.assertEqual([p for p in ranks if alive(p)], [], "ranks left")
        self.assert_pods_empty(within=1)
        self.assertFalse(any(os.path.exists(r) for r in ready), "ready file left behind")

    def test_a_frozen_launcher_is_lost_within_the_heartbeat_timeout(self):
        # SIGSTOP: the connections stay open and silent, as when the launcher's
        # node hangs; only the heartbeats can tell.
        job = self.launcher(3, "--heartbeat_interval", "0.5", "--heartbeat_timeout", "2",
                            program=("sleep",))
        agents = [self.agent(pod) for pod in range(3)]
        self.wait_for("6 ranks", lambda: len(self.started_pids()) == 6)
        ranks = self.started_pids()
        os.kill(job.pid, signal.SIGSTOP)
        stopped = time.monotonic()
        try:
            for pod, a in enumerate(agents):
                acode, _, aerr = self.finish(a, timeout=15)
                self.assertEqual(acode, 69, "agent in pod %d: %s" % (pod, aerr))
                self.assertIn("launcher lost: no heartbeat from the launcher", aerr)
            took = time.monotonic() - stopped
            self.assertGreater(took, 1.5, "lost before the heartbeat timeout")
            self.assertLess(took, 2 + 1.5, "lost after the heartbeat timeout (2 s)")
            self.assertEqual([p for p in ranks if alive(p)], [], "ranks left")
            self.assert_pods_empty(within=1, pods=range(WORKERS))
        finally:
            os.kill(job.pid, signal.SIGKILL)
            job.communicate()




class TrainingSurvivesFaults(PodTest):
    """dsworker with a checkpoint every 10 steps in pods 0-2 under --launcher
    join, the platform (soak_restarts.PodsSite) starting a failed agent
    again in its pod; one fault at a random moment: the job ends 0, every
    loss after the restart equals the uninterrupted run's bit for bit, and
    nothing is left in any pod. The seed is printed; DSLAUNCH_TEST_SEED
    repeats a run."""

    def check(self, fault):
        site = soak_restarts.PodsSite(PODS)
        self.addCleanup(site.close)
        work = tempfile.mkdtemp(prefix="train-", dir=self.volume)
        os.chmod(work, 0o777)  # every pod's UID writes there
        soak_restarts.prepare(work)
        whole = soak_restarts.uninterrupted(site, work)
        soak_restarts.assert_survives(self, site, work, whole, 0, fault)
        return site

    def test_a_pod_deleted_and_made_anew(self):
        self.check("pod deleted")

    def test_an_agent_killed_and_restarted_by_the_platform(self):
        self.check("agent SIGKILL")

    def test_an_agent_frozen_and_restarted_by_its_liveness_probe(self):
        site = self.check("agent SIGSTOP")
        # Nothing but the probe restarts a frozen agent in its pod.
        self.assertTrue(any("liveness" in r for r in site.restarts), site.restarts)


if __name__ == "__main__":
    unittest.main()
