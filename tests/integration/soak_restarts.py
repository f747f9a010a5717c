"""Soak of --max_restarts: N runs of dsworker on 3 nodes, each with random
faults at random moments, every run checked against one uninterrupted run
on the same nodes.

usage: DSL_BIN=build/bin python3 tests/integration/soak_restarts.py
           [--over local|ssh|pdsh|slurm|pods] [--runs 20] [--seed S]

Where the nodes are (--over):
  local  3 local nodes (127.0.0.1-3), --launcher local;
  ssh    a tests/cluster/cluster.sh namespace cluster of 4 nodes with an sshd
         each, --launcher ssh, --num_nodes 3:3: the fourth is a spare;
  pdsh   the same cluster through pdsh;
  slurm  a cluster.sh SLURM cluster of 3 nodes, inside salloc -N3
         (--launcher slurm: the agents are an srun step);
  pods   tests/pods/pods.sh pods, --launcher join; the soak restarts a failed
         agent in its pod, and one that fails the liveness probe, as the
         platform does.
All but local need root; the soak builds the cluster or pods and tears them
down.

A fault is one of (each site has those it can suffer):
  rank SIGKILL, rank SIGTERM  a random rank alone;
  agent SIGKILL               a random node's agent;
  agent SIGSTOP               frozen: its heartbeats stop, the launcher counts
                              the node lost, kills the agent (by pid over a
                              second ssh, pdsh or srun where the tool cannot end
                              it) and starts it again; in a pod the liveness
                              probe fails and the platform restarts it;
  link down                   a random node's network cable pulled for 1-4 s
                              (ssh, pdsh: the spare takes its place at once);
  node daemons                a SLURM node's slurmstepd and our agent under it
                              SIGKILLed, as a failing node ends them (slurm);
  pod deleted                 every process of a worker pod SIGKILLed, then its
                              agent started anew (pods).
Each run has one or two faults. Each run must end 0 with every loss after the
last restart equal, bit for bit, to the uninterrupted run's at that step
(every generation runs at world size 3), and nothing of it may be left on any
node: no dsworker, no dsagent. The seed is printed first; a failing run says
its seed and faults. Exit 0 when every run passed, 1 otherwise.

The cluster tests (tests/cluster) run single faults through one_run().
"""
import argparse
import glob
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
BIN = os.path.abspath(os.environ.get("DSL_BIN", os.path.join(HERE, "../../build/bin")))
DSLAUNCH = os.path.join(BIN, "dslaunch")
DSWORKER = os.path.join(BIN, "dsworker")
CLUSTER_DIR = os.path.join(HERE, "../cluster")
STEPS = 300
CORPUS = ("In the beginning God created the heaven and the earth. And the earth was "
          "without form, and void; and darkness was upon the face of the deep. ") * 300
# Fast loss detection, so that a run takes seconds; no --node_cooldown: a
# node hit twice comes back (a flapping node's exclusion is tested apart).
FAULT_FLAGS = ["--max_restarts", "4", "--restart_backoff", "0", "--node_cooldown", "0",
               "--heartbeat_interval", "0.2", "--heartbeat_timeout", "1", "--kill_grace", "2"]


# ------------------------------------------------------------- the training
def config(work, ck, steps=STEPS):
    cfg = {
        "train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 1,
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "weight_decay": 0.1}},
        "gradient_clipping": 1.0, "steps_per_print": 1, "zero_optimization": {"stage": 2},
        "model": {"n_layer": 2, "n_head": 2, "n_embd": 32, "seq_len": 16, "vocab_size": 300},
        "data": {"train": os.path.join(work, "data", "train_000.bin"), "shuffle": False},
        "train": {"steps": steps, "seed": 7},
    }
    if ck:
        cfg["checkpoint"] = {"dir": ck, "every": 10}
    path = os.path.join(work, "ds-%s.json" % (os.path.basename(ck) if ck else "whole"))
    with open(path, "w") as f:
        json.dump(cfg, f)
    return path


def prepare(work):
    """The corpus, tokenised under work/data."""
    with open(os.path.join(work, "corpus.txt"), "w") as f:
        f.write(CORPUS)
    subprocess.run([DSWORKER, "prepare", "--input", os.path.join(work, "corpus.txt"),
                    "--out", os.path.join(work, "data"), "--vocab", "300"],
                   check=True, capture_output=True, timeout=120)


def records(logs):
    try:
        with open(os.path.join(logs, "metrics.jsonl")) as f:
            lines = f.read().split("\n")[:-1]
    except FileNotFoundError:
        return []
    return [json.loads(line) for line in lines if line]


def last_step(logs):
    return max((r.get("step", 0) for r in records(logs)), default=0)


def uninterrupted(site, work):
    """rank 0's loss at each step of a run on `site` that never failed."""
    logs = os.path.join(work, "logs-whole")
    job = site.launch(work, logs, config(work, None), ())
    err = job.communicate(timeout=300)[1].decode()
    if job.returncode != 0:
        raise RuntimeError("the uninterrupted run failed:\n" + err[-3000:])
    return {r["step"]: r["loss"] for r in records(logs) if r.get("rank") == 0}


def resumed_exactly(logs, whole, steps=STEPS):
    """None when the last generation resumed from a recent checkpoint (one
    of every 10 steps: at most one behind the last step recorded before the
    restart, so a resume from scratch fails) and every loss after the last
    restart equals the uninterrupted run's at that step, bit for bit, up to
    the last step; else what is wrong. With it, the number of restarts."""
    got = records(logs)
    restarts = [i for i, r in enumerate(got) if r.get("event") == "restart"]
    after = got[restarts[-1] + 1:] if restarts else got
    losses = {r["step"]: r["loss"] for r in after if r.get("rank") == 0}
    if steps not in losses:
        return "no record of the last step", len(restarts)
    if restarts:
        before = max((r.get("step", 0) for r in got[:restarts[-1]]), default=0)
        newest = max(0, (before - 1) // 10 * 10 - 10)
        if min(losses) - 1 < newest:
            return ("resumed at step %d, but step %d was recorded before the restart "
                    "(a checkpoint of step %d or later was complete)" % (
                        min(losses), before, newest)), len(restarts)
    for step, loss in sorted(losses.items()):
        if loss != whole[step]:
            return "step %d: loss %r, uninterrupted %r" % (step, loss, whole[step]), \
                len(restarts)
    return None, len(restarts)


# ------------------------------------------------------------- processes
def proc_stat(pid):
    """(state, parent pid, argv) of a live pid, or None."""
    try:
        with open("/proc/%d/stat" % pid) as f:
            fields = f.read().rsplit(")", 1)[1].split()
        with open("/proc/%d/cmdline" % pid, "rb") as f:
            argv = f.read().split(b"\0")
    except (OSError, ValueError):
        return None
    return fields[0], int(fields[1]), argv


def is_agent(pid, stat):
    """The agent itself, not its containment guard (a fork of it with the
    same command line, one level down)."""
    parent = proc_stat(stat[1])
    return (os.path.basename(stat[2][0]) == b"dsagent" and
            not (parent and os.path.basename(parent[2][0]) == b"dsagent"))


def kind_of(pid):
    stat = proc_stat(pid)
    if not stat or stat[0] in ("Z", "X"):
        return None
    if os.path.basename(stat[2][0]) == b"dsworker":
        return "rank"
    return "agent" if is_agent(pid, stat) else "other"


def kill(pid, sig):
    try:
        os.kill(pid, sig)
        return True
    except ProcessLookupError:
        return False


# ------------------------------------------------------------- the sites
class LocalSite:
    """3 local nodes; what a run started carries DSL_SOAK=<work> in its
    environment, wherever it was reparented."""
    name = "local"
    faults = ("rank SIGKILL", "rank SIGTERM", "agent SIGKILL", "agent SIGSTOP")

    def __init__(self, work):
        self.work = work
        self.hostfile = os.path.join(work, "hosts")
        with open(self.hostfile, "w") as f:
            f.write("".join("127.0.0.%d slots=1\n" % i for i in (1, 2, 3)))

    def launch(self, work, logs, cfg, extra):
        env = dict(os.environ, OMP_NUM_THREADS="1", DSL_SOAK=work)
        return subprocess.Popen(
            [DSLAUNCH, "--hostfile", self.hostfile, "--launcher", "local", "--no_local_rank",
             "--log_dir", logs, *extra, DSWORKER, "train", "--config", cfg],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env)

    def pids(self):
        marker = ("DSL_SOAK=%s" % self.work).encode()
        found = []
        for pid in map(int, filter(str.isdigit, os.listdir("/proc"))):
            try:
                with open("/proc/%d/environ" % pid, "rb") as f:
                    if marker not in f.read().split(b"\0"):
                        continue
            except OSError:
                continue
            found.append(pid)
        return found

    def victims(self, kind):
        return [pid for pid in self.pids() if kind_of(pid) == kind]

    def inflict(self, fault, rng):
        kind, sig = fault.split()
        pids = self.victims(kind)
        if not pids:
            return None
        pid = rng.choice(pids)
        return fault if kill(pid, getattr(signal, sig)) else None

    def leftovers(self):
        return [pid for pid in self.pids() if kind_of(pid)]

    def close(self):
        for pid in self.pids():  # only what this soak started
            kill(pid, signal.SIGKILL)


class ClusterSite:
    """A cluster.sh cluster (its dict from cluster_env.up): nodes 1-3, the
    fourth a spare (--num_nodes 3:3) where it has one; started over ssh or
    pdsh. Everything of a run is in the nodes' namespaces."""
    faults = ("rank SIGKILL", "rank SIGTERM", "agent SIGKILL", "agent SIGSTOP", "link down")

    def __init__(self, cluster, launcher="ssh"):
        self.cluster = cluster
        self.launcher = launcher
        self.name = launcher
        self.sh = os.path.join(CLUSTER_DIR, "cluster.sh")
        self.count = len(cluster["CLUSTER_NODES"].split())
        self.hostfile = cluster.get("hostfile4", cluster["CLUSTER_HOSTFILE"])

    def launch(self, work, logs, cfg, extra):
        # The fourth node is a spare of a restarting job; without restarts
        # (the uninterrupted run) it is not used.
        spare = ["--num_nodes", "3:3" if "--max_restarts" in extra else "3"]
        return subprocess.Popen(
            [DSLAUNCH, "--hostfile", self.hostfile, "--launcher", self.launcher,
             "--ssh_identity", self.cluster["CLUSTER_KEY"],
             "--ssh_known_hosts", self.cluster["CLUSTER_KNOWN_HOSTS"], "--ssh_user", "root",
             "--ssh_timeout", "2", "--no_local_rank", "--env", "OMP_NUM_THREADS=1",
             "--log_dir", logs, *spare, *extra, DSWORKER, "train", "--config", cfg],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)

    def keep(self, i):
        """Pids of node i the soak must not count: its sshd."""
        with open(os.path.join(self.cluster["dir"], "node%d" % i, "sshd.pid")) as f:
            return {int(f.read())}

    def node_pids(self, i):
        p = subprocess.run([self.sh, "pids", self.cluster["dir"], str(i)],
                           capture_output=True, timeout=30)
        if p.returncode != 0:
            raise RuntimeError("cluster.sh pids %d: %s" % (i, p.stderr.decode()))
        keep = self.keep(i)
        return [pid for pid in map(int, p.stdout.split()) if pid not in keep]

    def victims(self, kind):
        """Ranks, or the agents of nodes that run ranks (not a spare)."""
        found = []
        for i in range(1, self.count + 1):
            kinds = {pid: kind_of(pid) for pid in self.node_pids(i)}
            if "rank" in kinds.values():
                found += [pid for pid, k in kinds.items() if k == kind]
        return found

    def inflict(self, fault, rng):
        if fault == "link down":
            i = rng.randint(1, 3)
            subprocess.run([self.sh, "link", self.cluster["dir"], str(i), "down"],
                           check=True, timeout=30)
            try:
                time.sleep(rng.uniform(1, 4))
            finally:
                subprocess.run([self.sh, "link", self.cluster["dir"], str(i), "up"],
                               check=True, timeout=30)
            return "node %d's link down" % i
        return LocalSite.inflict(self, fault, rng)

    def leftovers(self):
        return [pid for i in range(1, self.count + 1) for pid in self.node_pids(i)
                if kind_of(pid)]

    def close(self):
        for i in range(1, self.count + 1):
            subprocess.run([self.sh, "link", self.cluster["dir"], str(i), "up"], timeout=30)


class SlurmSite(ClusterSite):
    """A cluster.sh SLURM cluster of 3 nodes; each run inside salloc -N3."""
    name = "slurm"
    faults = ("rank SIGKILL", "rank SIGTERM", "agent SIGKILL", "agent SIGSTOP",
              "node daemons")

    def __init__(self, cluster):
        self.cluster = cluster
        self.sh = os.path.join(CLUSTER_DIR, "cluster.sh")
        self.count = 3

    def launch(self, work, logs, cfg, extra):
        return subprocess.Popen(
            [self.sh, "login", self.cluster["dir"], "salloc", "-N3", "--ntasks-per-node=1",
             DSLAUNCH, "--no_local_rank", "--env", "OMP_NUM_THREADS=1", "--log_dir", logs,
             *extra, DSWORKER, "train", "--config", cfg],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)

    def keep(self, i):
        with open(os.path.join(self.cluster["dir"], "node%d.init" % i)) as f:
            return {int(f.read())}  # slurmd

    def inflict(self, fault, rng):
        if fault != "node daemons":
            return LocalSite.inflict(self, fault, rng)
        i = rng.randint(1, 3)
        pids = self.node_pids(i)
        stepds = [p for p in pids if (proc_stat(p) or ("", 0, [b""]))[2][0].startswith(
            b"slurmstepd")]
        agents = [p for p in pids if kind_of(p) == "agent" and
                  (proc_stat(p) or ("", 0))[1] in stepds]
        for pid in stepds + agents:
            kill(pid, signal.SIGKILL)
        return "node %d's slurmstepd and agent SIGKILLed" % i if agents else None

    def leftovers(self):
        # A finished step's slurmstepd takes a moment to go: it counts too.
        return [pid for i in range(1, 4) for pid in self.node_pids(i)]

    def close(self):
        pass


class PodsSite:
    """--launcher join across tests/pods/pods.sh pods (its up's KEY=value
    lines as a dict): the launcher in its pod, an agent in each of worker
    pods 0-2 (a pod beyond --num_nodes is no spare under join: its claim is
    refused). The soak plays the platform: an agent that ends with a failure
    while the job runs is started again in its pod (restartPolicy
    OnFailure), also after its pod was deleted and made anew; and it runs the
    manifests' liveness probe (dsagent --alive_check on the agent's
    --alive_file, scaled down: every second, 5 s, twice), restarting the
    container of an agent that fails it, as the kubelet does with a frozen
    one. Each agent has the manifests' ready and alive files in its pod's
    TMPDIR, which outlives its container as an emptyDir does. The training's
    files are in the pods' shared volume (every pod's UID writes there)."""
    name = "pods"
    faults = ("rank SIGKILL", "rank SIGTERM", "agent SIGKILL", "agent SIGSTOP",
              "pod deleted")
    ALIVE_WITHIN, PROBE_FAILURES = 5, 2
    POD_ARGS = ["--num_gpus", "1", "--no_local_rank", "--env", "OMP_NUM_THREADS=1"]

    def __init__(self, pods):
        self.pods = pods
        self.sh = os.path.join(HERE, "../pods/pods.sh")
        self.agents = {}
        self.lock = threading.Lock()

    def run_in_pod(self, pod, argv, log=None):
        return subprocess.Popen([self.sh, "run", self.pods["PODS_DIR"], str(pod), "--", *argv],
                                stdin=subprocess.DEVNULL, stdout=log or subprocess.DEVNULL,
                                stderr=log or subprocess.PIPE)

    def pod_file(self, pod, name):
        return os.path.join(self.pods["PODS_DIR"], "pod-%d" % pod, "tmp", name)

    def start_agent(self, pod):
        """Its log (the container's): <log_dir>-agent-POD-N.log."""
        self.started += 1
        self.probe_failures[pod] = 0
        with open("%s-agent-%d-%d.log" % (self.log_prefix, pod, self.started), "w") as log:
            self.agents[pod] = self.run_in_pod(pod, [
                os.path.join(self.pods["PODS_BIN"], "dsagent"),
                "--join", "%s:29400" % self.pods["PODS_LAUNCHER"],
                "--secret_file", self.pods["PODS_SECRET"],
                "--ready_file", self.pod_file(pod, "dsagent.joined"),
                "--alive_file", self.pod_file(pod, "dsagent.alive")], log)
            self.started_at[pod] = time.monotonic()

    def alive(self, pod):
        """The liveness probe's command; a container just started is given
        the manifests' initial delay (scaled down)."""
        if time.monotonic() - self.started_at[pod] < self.ALIVE_WITHIN:
            return True
        return subprocess.run(
            [os.path.join(self.pods["PODS_BIN"], "dsagent"), "--alive_check",
             self.pod_file(pod, "dsagent.alive"), "--alive_within", str(self.ALIVE_WITHIN)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=30).returncode == 0

    def restart_container(self, pod):
        """The container's processes killed (the pod, its TMPDIR and its
        network stay), then it starts again."""
        for pid in self.pod_pids(pod):
            kill(pid, signal.SIGKILL)
        self.agents[pod].kill()
        self.agents[pod].wait()
        self.start_agent(pod)

    def launch(self, work, logs, cfg, extra):
        job = self.run_in_pod("launcher", [
            os.path.join(self.pods["PODS_BIN"], "dslaunch"), "--launcher", "join",
            "--num_nodes", "3", "--secret_file", self.pods["PODS_SECRET"], "--log_dir", logs,
            *self.POD_ARGS, *extra,
            os.path.join(self.pods["PODS_BIN"], "dsworker"), "train", "--config", cfg])
        with self.lock:
            # The agents' logs beside the launcher's --log_dir (which is the
            # launcher's UID's alone).
            self.log_prefix, self.restarts, self.agents, self.started = logs, [], {}, 0
            self.probe_failures, self.started_at = {}, {}
            self.job = job
            for pod in range(3):
                self.start_agent(pod)
        threading.Thread(target=self.platform, args=(job,), daemon=True).start()
        return job

    def platform(self, job):
        """While the launcher runs: agents that failed are started again,
        and those that fail the liveness probe twice in a row restarted."""
        next_probe = time.monotonic() + 1
        while True:
            with self.lock:
                if job.poll() is not None:
                    return
                probe = time.monotonic() >= next_probe
                if probe:
                    next_probe = time.monotonic() + 1
                for pod, agent in list(self.agents.items()):
                    # Not one that the job's end ended (the launcher goes
                    # after its agents).
                    if agent.poll() not in (None, 0) and not self.ending(job):
                        self.restarts.append("pod %d's agent (exit %d)" % (
                            pod, agent.returncode))
                        self.start_agent(pod)
                    elif probe and agent.poll() is None:
                        self.probe_failures[pod] = (
                            0 if self.alive(pod) else self.probe_failures[pod] + 1)
                        if (self.probe_failures[pod] >= self.PROBE_FAILURES
                                and not self.ending(job)):
                            self.restarts.append("pod %d's agent (liveness)" % pod)
                            self.restart_container(pod)
            time.sleep(0.1)

    @staticmethod
    def ending(job):
        try:
            job.wait(timeout=0.5)
            return True
        except subprocess.TimeoutExpired:
            return False

    def pod_pids(self, pod):
        p = subprocess.run([self.sh, "pids", self.pods["PODS_DIR"], str(pod)],
                           capture_output=True, timeout=30)
        if p.returncode != 0:
            raise RuntimeError("pods.sh pids %s: %s" % (pod, p.stderr.decode()))
        return [int(x) for x in p.stdout.split()]

    def victims(self, kind):
        """Ranks, or the agents of pods that run ranks (not a spare)."""
        found = []
        for pod in range(3):
            kinds = {pid: kind_of(pid) for pid in self.pod_pids(pod)}
            if "rank" in kinds.values():
                found += [pid for pid, k in kinds.items() if k == kind]
        return found

    def inflict(self, fault, rng):
        if fault != "pod deleted":
            return LocalSite.inflict(self, fault, rng)
        pod = rng.randint(0, 2)
        with self.lock:  # the platform deletes it whole, then makes it anew
            for pid in self.pod_pids(pod):
                kill(pid, signal.SIGKILL)
            # Its container too, should it be still on its way into the pod;
            # a new pod has a new TMPDIR.
            self.agents[pod].kill()
            self.agents[pod].wait()
            for name in ("dsagent.joined", "dsagent.alive"):
                if os.path.lexists(self.pod_file(pod, name)):
                    os.unlink(self.pod_file(pod, name))
            if self.job.poll() is None:
                self.start_agent(pod)
        return "pod %d deleted and made anew" % pod

    def leftovers(self):
        return [pid for pod in ["launcher", 0, 1, 2] for pid in self.pod_pids(pod)
                if kind_of(pid)]

    def stale_files(self):
        """Agents' run directories left in a pod's TMPDIR (an agent killed
        before its end leaves one; the next agent of the job removes it)."""
        return sorted(path for pod in range(3)
                      for path in glob.glob(self.pod_file(pod, "dsl-*")))

    def close(self):
        with self.lock:
            for agent in self.agents.values():
                if agent.poll() is None:
                    agent.kill()
                agent.wait()


# ------------------------------------------------------------- one run
def one_run(site, work, whole, run, rng, faults=None):
    """One faulty run on `site`: (passed, the faults that landed, what)."""
    ck = os.path.join(work, "ck-%d" % run)
    logs = os.path.join(work, "logs-%d" % run)
    job = site.launch(work, logs, config(work, ck), FAULT_FLAGS)
    if faults is None:
        faults = [rng.choice(site.faults) for _ in range(rng.randint(1, 2))]
    done = []
    try:
        for fault in faults:
            at = rng.randint(5, STEPS // 2)
            deadline = time.monotonic() + 60
            while last_step(logs) < at:
                if job.poll() is not None or time.monotonic() > deadline:
                    break
                time.sleep(0.01)
            landed = site.inflict(fault, rng)
            if landed:
                done.append("%s at step >= %d" % (landed, at))
            time.sleep(rng.uniform(0, 0.5))
        err = job.communicate(timeout=180)[1].decode()
    except subprocess.TimeoutExpired:
        job.kill()
        err = job.communicate()[1].decode()
        return False, done, "did not end within 180 s\n" + err[-3000:]
    if job.returncode != 0:
        return False, done, "exit %d\n%s" % (job.returncode, err[-3000:])
    differs, restarts = resumed_exactly(logs, whole)
    if differs:
        return False, done, differs
    deadline = time.monotonic() + 15
    while site.leftovers():
        if time.monotonic() > deadline:
            return False, done, "left running: %s%s" % ([
                (pid, (proc_stat(pid) or ("", 0, [b"?"]))[1:]) for pid in site.leftovers()],
                "; the platform restarted: %s" % getattr(site, "restarts", None))
        time.sleep(0.05)
    stale = getattr(site, "stale_files", list)()
    if stale:
        return False, done, "left behind: %s" % stale
    return True, done, "%d restart(s)" % restarts


def assert_survives(test, site, work, whole, run, fault):
    """The cluster, SLURM and pods suites' check: `fault` at a random moment
    of one run (the seed printed; DSLAUNCH_TEST_SEED repeats it) lands, and
    the run passes with at least one restart."""
    seed = int(os.environ.get("DSLAUNCH_TEST_SEED", time.time_ns() % 100000))
    print("%s over %s: seed %d" % (fault, site.name, seed))
    ok, done, what = one_run(site, work, whole, run, random.Random(seed), faults=[fault])
    test.assertEqual(len(done), 1, "seed %d: the fault did not land: %s" % (seed, what))
    test.assertTrue(ok, "seed %d, %s: %s" % (seed, done[0], what))
    test.assertRegex(what, r"^[1-9]\d* restart")


def open_site(over, work, stack):
    """The site `over` names; `stack` collects its tear-down."""
    if over == "local":
        return LocalSite(work)
    if over == "pods":
        parent = tempfile.mkdtemp(prefix="dsl-soak-pods-")
        os.chmod(parent, 0o755)
        stack.append(lambda: shutil.rmtree(parent, ignore_errors=True))
        d = os.path.join(parent, "p")
        p = subprocess.run([os.path.join(HERE, "../pods/pods.sh"), "up", "4", d],
                           capture_output=True, timeout=120, env=dict(os.environ, PODS_BIN=BIN))
        if p.returncode != 0:
            raise RuntimeError("pods.sh up failed:\n" + p.stderr.decode())
        pods = dict(line.partition("=")[::2] for line in p.stdout.decode().splitlines())
        pods = {k: v.strip('"') for k, v in pods.items()}
        stack.append(lambda: subprocess.run(
            [os.path.join(HERE, "../pods/pods.sh"), "down", pods["PODS_DIR"]], timeout=120))
        return PodsSite(pods)
    sys.path.insert(0, CLUSTER_DIR)
    import cluster_env
    if over == "slurm":
        cluster = cluster_env.up(3, "dsl-soak-slurm-", CLUSTER_SLURM="1", CLUSTER_SSHD="0")
        stack.append(lambda: cluster_env.down(cluster))
        return SlurmSite(cluster)
    cluster = cluster_env.up(4, "dsl-soak-")
    stack.append(lambda: cluster_env.down(cluster))
    return ClusterSite(cluster, over)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--over", choices=("local", "ssh", "pdsh", "slurm", "pods"),
                    default="local")
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--seed", type=int, default=time.time_ns() % 1000000)
    args = ap.parse_args()
    print("soak_restarts: seed %d, %d runs over %s" % (args.seed, args.runs, args.over),
          flush=True)
    rng = random.Random(args.seed)
    work = tempfile.mkdtemp(prefix="dsl-soak-")
    os.chmod(work, 0o755)
    stack = []
    site = None
    try:
        site = open_site(args.over, work, stack)
        if args.over == "pods":  # where every pod's UID writes
            os.rmdir(work)
            work = tempfile.mkdtemp(prefix="soak-", dir=site.pods["PODS_VOLUME"])
            os.chmod(work, 0o777)
        prepare(work)
        whole = uninterrupted(site, work)
        failed = 0
        for run in range(args.runs):
            ok, faults, what = one_run(site, work, whole, run, rng)
            print("run %2d %s: %s; %s" % (run, "ok  " if ok else "FAIL", ", ".join(faults) or
                                         "no fault landed", what), flush=True)
            failed += not ok
        print("soak_restarts: %d of %d runs passed over %s (seed %d)" %
              (args.runs - failed, args.runs, args.over, args.seed))
        if failed:
            keep = tempfile.mkdtemp(prefix="dsl-soak-kept-")
            shutil.copytree(work, keep, dirs_exist_ok=True,
                            ignore=shutil.ignore_patterns("ck-*", "data"))
            print("soak_restarts: the runs' logs are kept in " + keep)
        return 1 if failed else 0
    finally:
        if site:
            site.close()
        for down in reversed(stack):
            down()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
