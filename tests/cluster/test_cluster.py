"""Cluster tests: 3 nodes (network namespaces with an sshd each, built by
cluster.sh) x 2 ranks, started over SSH by dslaunch (under ctest, the
programs of the wheel deploy/packages.sh made, installed into a fresh venv); a fourth node is the
spare of the elastic tests and in no other test's hostfile. Needs root; skips itself
with a message otherwise. Every test checks that nothing is left running on
any node afterwards."""
import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "../integration"))
import cluster_env  # noqa: E402

# Under ctest, from the installed wheel (issue 22): see install_wheel_if_asked.
cluster_env.install_wheel_if_asked()
from harness import DSLAUNCH, MPI_RANK_PY, PY, RANK_PY, SYSTEM_PY, LaunchTest, need_mpi  # noqa: E402,E501,I100
import deepspeed_env  # noqa: E402
import soak_restarts  # noqa: E402
from cluster_env import CLUSTER_SH  # noqa: E402
CLUSTER = {}


def setUpModule():
    CLUSTER.update(cluster_env.up(4, "dsl-cluster-"))
    CLUSTER["nodes"] = CLUSTER["CLUSTER_NODES"].split()
    # Three nodes for every test; all four (the last a spare) where asked.
    CLUSTER["hostfile4"] = CLUSTER["CLUSTER_HOSTFILE"]
    CLUSTER["CLUSTER_HOSTFILE"] = os.path.join(CLUSTER["dir"], "hostfile3")
    with open(CLUSTER["hostfile4"]) as f, open(CLUSTER["CLUSTER_HOSTFILE"], "w") as out:
        out.writelines(f.readlines()[:3])


def tearDownModule():
    cluster_env.down(CLUSTER)


class ClusterTest(LaunchTest):
    def ssh_args(self, hostfile=None, extra=(), **env):
        """Over SSH only exported variables travel: the test's go as --env."""
        env.setdefault("OUT_DIR", self.out)
        env_flags = [x for k, v in env.items() for x in ("--env", "%s=%s" % (k, v))]
        return [DSLAUNCH, "--hostfile", hostfile or CLUSTER["CLUSTER_HOSTFILE"],
                "--launcher", "ssh", "--ssh_identity", CLUSTER["CLUSTER_KEY"],
                "--ssh_known_hosts", CLUSTER["CLUSTER_KNOWN_HOSTS"], "--ssh_user", "root",
                "--no_local_rank", *env_flags, *extra]

    def pdsh_args(self, hostfile=None, extra=(), **env):
        argv = self.ssh_args(hostfile=hostfile, extra=extra, **env)
        argv[argv.index("ssh")] = "pdsh"
        return argv

    def mpirun_args(self, extra=(), **env):
        argv = self.ssh_args(extra=extra, **env)
        argv[argv.index("ssh")] = "openmpi"
        # The nodes share one hostname (unless CLUSTER_UTS=1) and /dev/shm
        # (only the network namespace differs): OpenMPI would take ranks of
        # different nodes for neighbours and pair them over shared memory.
        return argv + ["--launcher_args", "--mca btl tcp,self"]

    def run_mpi(self, argv, **kw):
        return self.run_job(argv, OMPI_MCA_plm_rsh_args="-F " + CLUSTER["CLUSTER_SSH_CONFIG"],
                            **kw)

    def node_pids(self, i):
        """Live pids in node i's namespace, other than its sshd."""
        with open(os.path.join(CLUSTER["dir"], "node%d" % i, "sshd.pid")) as f:
            sshd = int(f.read())
        p = subprocess.run([CLUSTER_SH, "pids", CLUSTER["dir"], str(i)],
                           capture_output=True, timeout=30)
        # An empty answer from a failed command would read as "nothing left".
        self.assertEqual(p.returncode, 0, "cluster.sh pids %d: %s" % (i, p.stderr.decode()))
        pids = [int(x) for x in p.stdout.split()]
        return [x for x in pids if x != sshd and self.alive(x)]

    def tearDown(self):
        deadline = time.monotonic() + 10
        for i in range(1, len(CLUSTER["nodes"]) + 1):
            while self.node_pids(i):
                if time.monotonic() > deadline:
                    left = self.node_pids(i)
                    self.fail("processes left on node %d: %s" % (i, left))
                time.sleep(0.1)
        super().tearDown()


class Placement(ClusterTest):
    def test_ranks_run_on_their_nodes_with_the_contract_and_exact_argv(self):
        hostile = ["a b", "'q'", '"dq"', "$(touch /tmp/pwned-c)", "`id`", "*", "x\ny", "", "\\"]
        keys = ["RANK", "LOCAL_RANK", "NODE_RANK", "WORLD_SIZE", "MASTER_ADDR",
                "CUDA_VISIBLE_DEVICES", "DSLAUNCH_JOB_ID", "HOSTILE", "NCCL_DEBUG"]
        p = self.run_job(self.ssh_args(extra=["--env", "HOSTILE=$(id) 'q' \"d\" *"],
                                       ENV_KEYS=json.dumps(keys)) +
                         [PY, RANK_PY, "env", *hostile], NCCL_DEBUG="INFO")
        self.assertEqual(p.returncode, 0, p.stderr.decode())
        nodes = CLUSTER["nodes"]
        for rank in range(6):
            with open(os.path.join(self.out, "env-%d.json" % rank)) as f:
                env = json.load(f)
            with open(os.path.join(self.out, "argv-%d.json" % rank)) as f:
                self.assertEqual(json.load(f), hostile)
            node = rank // 2
            self.assertEqual(env["__address__"], nodes[node], "rank %d placement" % rank)
            self.assertEqual(env["NODE_RANK"], str(node))
            self.assertEqual(env["LOCAL_RANK"], str(rank % 2))
            self.assertEqual(env["WORLD_SIZE"], "6")
            self.assertEqual(env["MASTER_ADDR"], nodes[0])
            self.assertEqual(env["CUDA_VISIBLE_DEVICES"], "0,1")
            self.assertEqual(env["HOSTILE"], "$(id) 'q' \"d\" *")
            self.assertEqual(env["NCCL_DEBUG"], "INFO", "NCCL_ is exported by default")
        self.assertFalse(os.path.exists("/tmp/pwned-c"))


class FailureAcrossNodes(ClusterTest):
    def test_rank_failing_on_node_3_tears_down_nodes_1_and_2_within_a_second(self):
        p = self.run_job(self.ssh_args() + [PY, RANK_PY, "fail", "5", "exit9"], timeout=60)
        err = p.stderr.decode()
        self.assertEqual(p.returncode, 9, err)
        self.assertIn("FAILED: rank 5 on %s" % CLUSTER["nodes"][2], err)
        # The failing rank waited for every rank's start file, then exited:
        # measured here, not by the launcher, the whole job (ranks on every
        # node gone, agents and launcher exited) ends soon after the last
        # rank started.
        starts = sorted(n for n in os.listdir(self.out) if n.startswith("start-"))
        self.assertEqual(starts, ["start-%d" % r for r in range(6)])
        last_start_ns = 0
        for name in starts:
            with open(os.path.join(self.out, name)) as f:
                last_start_ns = max(last_start_ns, int(f.read().split()[0]))
        end_to_end_s = (p.end_ns - last_start_ns) / 1e9
        self.assertLess(end_to_end_s, 2.0, "job ended %.2f s after the last rank "
                        "started (rank 5 fails then)\n%s" % (end_to_end_s, err))
        self.assertIn("all gone", err)
        gone_ms = float(err.split("all gone ")[1].split(" ms")[0])
        self.assertLess(gone_ms, 1000, err)

    def test_launcher_sigkill_leaves_nothing_on_any_node(self):
        job = self.start_job(self.ssh_args() + [PY, RANK_PY, "sleep"])
        self.wait_started(6)
        job.kill()
        job.communicate(timeout=10)
        self.assert_no_leftovers(within=10)

    def test_cut_link_is_detected_and_reported(self):
        hb = ["--heartbeat_interval", "0.3", "--heartbeat_timeout", "2", "--kill_grace", "1"]
        job = self.start_job(self.ssh_args(extra=hb) + [PY, RANK_PY, "sleep"])
        self.wait_started(6)
        subprocess.run([CLUSTER_SH, "link", CLUSTER["dir"], "2", "down"], check=True, timeout=30)
        try:
            out, err = job.communicate(timeout=60)
            # The cut node's agent lost the launcher too and stopped its ranks.
            self.assert_no_leftovers(within=15)
        finally:
            subprocess.run([CLUSTER_SH, "link", CLUSTER["dir"], "2", "up"], timeout=30)
        self.assertEqual(job.returncode, 69, err.decode())
        self.assertIn("node 1 (%s) was lost" % CLUSTER["nodes"][1], err.decode())


class Restarts(ClusterTest):
    """--max_restarts over SSH: a lost node's agent is started again in a new
    SSH session, the others stay; a node that cannot come back ends the job
    with 69 after --rejoin_timeout, naming it."""
    # Generation 0 waits (its start file says it runs); later ones finish.
    # The start file appears whole (written aside, then renamed): the
    # harness reads every start- file it finds.
    SCRIPT = ('echo "$(date +%s%N) $$" > "$OUT_DIR/.s-$RANK"; '
              'mv "$OUT_DIR/.s-$RANK" "$OUT_DIR/start-$RANK-$DSLAUNCH_RESTART_COUNT"; '
              'if [ "$DSLAUNCH_RESTART_COUNT" = 0 ]; then exec sleep 60; fi; '
              'echo "generation $DSLAUNCH_RESTART_COUNT rank $RANK"')

    def agent_on(self, i):
        for pid in self.node_pids(i):
            try:
                with open("/proc/%d/cmdline" % pid, "rb") as f:
                    argv = f.read().split(b"\0")
            except OSError:
                continue
            if os.path.basename(argv[0]) == b"dsagent" and b"--connect" in argv:
                return pid
        return None

    def test_an_agent_killed_on_a_node_is_started_again_over_ssh(self):
        self.check_a_killed_agent_is_started_again(self.ssh_args)

    def test_an_agent_killed_on_a_node_is_started_again_through_pdsh(self):
        """A pdsh of its own for the node, once no rank runs (its agent's
        secret comes through pdsh's pipes)."""
        err = self.check_a_killed_agent_is_started_again(self.pdsh_args)
        self.assertEqual(err.count("agents started on 3 nodes"), 1, err[-3000:])

    def check_a_killed_agent_is_started_again(self, args):
        job = self.start_job(args(extra=["--max_restarts", "1", "--restart_backoff", "0",
                                         "--log_level", "info"]) +
                             ["/bin/sh", "-c", self.SCRIPT])
        self.addCleanup(lambda: job.poll() is None and job.kill())
        self.wait_started(6)
        os.kill(self.agent_on(3), signal.SIGKILL)
        out, err = job.communicate(timeout=60)
        out, err = out.decode(), err.decode()
        self.assertEqual(job.returncode, 0, err[-3000:])
        node = CLUSTER["nodes"][2]
        self.assertIn("node 2 (%s) was lost" % node, err)
        self.assertIn("starting the agent of node 2 (%s) again" % node, err)
        self.assertIn("node 2 (%s) is back" % node, err)
        for rank in range(6):
            self.assertIn("generation 1 rank %d" % rank, out)
        self.assert_no_leftovers(within=10)
        return err

    def test_a_node_that_cannot_come_back_ends_the_job_with_69_naming_it(self):
        hb = ["--heartbeat_interval", "0.3", "--heartbeat_timeout", "2", "--kill_grace", "1",
              "--ssh_timeout", "2", "--max_restarts", "3", "--rejoin_timeout", "4"]
        job = self.start_job(self.ssh_args(extra=hb) + ["/bin/sh", "-c", self.SCRIPT])
        self.addCleanup(lambda: job.poll() is None and job.kill())
        self.wait_started(6)
        subprocess.run([CLUSTER_SH, "link", CLUSTER["dir"], "2", "down"], check=True, timeout=30)
        try:
            out, err = job.communicate(timeout=60)
            self.assert_no_leftovers(within=15)
        finally:
            subprocess.run([CLUSTER_SH, "link", CLUSTER["dir"], "2", "up"], timeout=30)
        err = err.decode()
        self.assertEqual(job.returncode, 69, err[-3000:])
        self.assertIn("not enough nodes within --rejoin_timeout 4 s; missing: %s"
                      % CLUSTER["nodes"][1], err)
        self.assertIn("generation 0 on 3 nodes", err)


    def test_a_spare_takes_the_place_of_a_node_whose_link_is_cut(self):
        """--num_nodes 3:3 over four hosts: the fourth stands by; node 1's
        link is cut and the next generation runs on nodes 0, 2 and the spare,
        renumbered, at once (no waiting for node 1)."""
        self.check_a_spare_takes_a_cut_nodes_place(self.ssh_args)

    def test_through_pdsh_a_spare_takes_the_place_of_a_node_whose_link_is_cut(self):
        """pdsh cannot end one node's agent: the node's ssh under pdsh ends,
        and the other nodes' agents, started by the same pdsh, go on."""
        self.check_a_spare_takes_a_cut_nodes_place(self.pdsh_args)

    def check_a_spare_takes_a_cut_nodes_place(self, args):
        hb = ["--heartbeat_interval", "0.3", "--heartbeat_timeout", "2", "--kill_grace", "1",
              "--ssh_timeout", "2", "--max_restarts", "1", "--restart_backoff", "0",
              "--num_nodes", "3:3", "--rejoin_timeout", "60"]
        job = self.start_job(args(hostfile=CLUSTER["hostfile4"], extra=hb) +
                             ["/bin/sh", "-c", self.SCRIPT.replace(
                                 'rank $RANK"', 'rank $RANK on $(hostname -I)"')])
        self.addCleanup(lambda: job.poll() is None and job.kill())
        self.wait_started(6)
        self.assertIsNotNone(self.agent_on(4))  # the spare's agent stands by
        subprocess.run([CLUSTER_SH, "link", CLUSTER["dir"], "2", "down"], check=True, timeout=30)
        try:
            out, err = job.communicate(timeout=60)
        finally:
            subprocess.run([CLUSTER_SH, "link", CLUSTER["dir"], "2", "up"], timeout=30)
        out, err = out.decode(), err.decode()
        self.assertEqual(job.returncode, 0, err[-3000:])
        nodes = CLUSTER["nodes"]
        self.assertIn("node 1 (%s) was lost" % nodes[1], err)
        self.assertIn("on 3 nodes (%s, %s, %s), 6 ranks" % (nodes[0], nodes[2], nodes[3]),
                      err)
        # The spare is node rank 2 now: ranks 4 and 5 run there.
        for rank in (4, 5):
            self.assertRegex(out, r"generation 1 rank %d on .*\b%s\b" % (
                rank, re.escape(nodes[3])))
        self.assert_no_leftovers(within=15)


class TrainingSurvivesFaults(ClusterTest):
    """dsworker with a checkpoint every 10 steps on the three nodes, the
    fourth a spare (--num_nodes 3:3), one fault at a random moment: the job
    ends 0, every loss after the restart equals the uninterrupted run's on
    the same nodes bit for bit (the world size stays 3), and nothing is left
    on any node (soak_restarts.one_run checks all three). The seed is
    printed; DSLAUNCH_TEST_SEED repeats a run."""

    @classmethod
    def setUpClass(cls):
        cls.work = tempfile.mkdtemp(prefix="dsl-train-")
        soak_restarts.prepare(cls.work)
        cls.whole = soak_restarts.uninterrupted(
            soak_restarts.ClusterSite(CLUSTER, "ssh"), cls.work)
        cls.runs = 0

    @classmethod
    def tearDownClass(cls):
        subprocess.run(["rm", "-rf", cls.work], timeout=60)

    def check(self, fault, launcher="ssh"):
        TrainingSurvivesFaults.runs += 1
        soak_restarts.assert_survives(self, soak_restarts.ClusterSite(CLUSTER, launcher),
                                      self.work, self.whole, self.runs, fault)

    def test_a_rank_killed_over_ssh(self):
        self.check("rank SIGKILL")

    def test_an_agent_killed_over_ssh(self):
        self.check("agent SIGKILL")

    def test_a_frozen_agent_over_ssh(self):
        self.check("agent SIGSTOP")

    def test_a_nodes_link_cut_over_ssh(self):
        self.check("link down")

    def test_an_agent_killed_through_pdsh(self):
        self.check("agent SIGKILL", "pdsh")

    def test_a_frozen_agent_through_pdsh(self):
        self.check("agent SIGSTOP", "pdsh")


class Preflight(ClusterTest):
    def hostfile_with(self, extra_host):
        path = os.path.join(self.dir, "hosts")
        with open(path, "w") as f:
            for n in CLUSTER["nodes"][:2]:
                f.write("%s slots=2\n" % n)
            f.write("%s slots=2\n" % extra_host)
        return path

    def assert_fails_fast(self, argv, needle):
        p = self.run_job(argv + ["sleep", "60"], timeout=60)
        err = p.stderr.decode()
        self.assertEqual(p.returncode, 69, err)
        self.assertIn(needle, err)
        self.assertIn("started nothing", err)
        self.assertLess(p.elapsed, 15, err)
        return err

    def test_unreachable_node(self):
        gateway = CLUSTER["CLUSTER_GATEWAY"]
        dead = gateway.rsplit(".", 1)[0] + ".200"
        self.assert_fails_fast(self.ssh_args(self.hostfile_with(dead), ["--ssh_timeout", "2"]),
                               "node 2 (%s): connect failed" % dead)

    def test_bad_key(self):
        key = os.path.join(self.dir, "other_key")
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", key], check=True)
        argv = self.ssh_args()
        argv[argv.index("--ssh_identity") + 1] = key
        self.assert_fails_fast(argv, "auth failed")

    def test_host_key_mismatch_names_host_and_file(self):
        known = os.path.join(self.dir, "known_hosts")
        with open(CLUSTER["CLUSTER_KNOWN_HOSTS"]) as f:
            lines = f.read().splitlines()
        other = os.path.join(self.dir, "other_host_key")
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", other], check=True)
        with open(other + ".pub") as f:
            fake = f.read().split()[:2]
        victim = CLUSTER["nodes"][1]
        with open(known, "w") as f:
            for line in lines:
                f.write((victim + " " + " ".join(fake)) if line.startswith(victim + " ") else line)
                f.write("\n")
        argv = self.ssh_args()
        argv[argv.index("--ssh_known_hosts") + 1] = known
        err = self.assert_fails_fast(argv, "host key of %s does not match the one in %s"
                                     % (victim, known))
        self.assertIn("node 1 (%s)" % victim, err)

    def test_unknown_host_key_is_refused_unless_accept_new(self):
        known = os.path.join(self.dir, "empty_known_hosts")
        open(known, "w").close()
        argv = self.ssh_args()
        argv[argv.index("--ssh_known_hosts") + 1] = known
        self.assert_fails_fast(argv, "is not in %s" % known)
        p = self.run_job(argv + ["--ssh_host_key_check", "accept-new", "true"], timeout=60)
        self.assertEqual(p.returncode, 0, p.stderr.decode())
        with open(known) as f:
            learned = f.read()
        for n in CLUSTER["nodes"][:3]:  # the hostfile's
            self.assertIn(n, learned)
        p = self.run_job(argv + ["true"], timeout=60)  # strict now passes
        self.assertEqual(p.returncode, 0, p.stderr.decode())

    def test_missing_remote_agent(self):
        self.assert_fails_fast(self.ssh_args(extra=["--agent_path", "/nonexistent/dsagent"]),
                               "/nonexistent/dsagent: No such file")

    def test_doctor_prints_a_table_per_node(self):
        argv = self.ssh_args()
        argv[1:1] = []
        p = self.run_job([DSLAUNCH, "doctor"] + argv[1:])
        self.assertEqual(p.returncode, 0, p.stdout.decode() + p.stderr.decode())
        out = p.stdout.decode()
        for n in CLUSTER["nodes"][:3]:  # the hostfile's
            self.assertRegex(out, n + r"\s+" + n + r"\s+ok\s+ok\s+ok\s+ok\s+ok")
        self.assertIn("3 of 3 nodes ready", out)
        # The nodes share this machine's hostname and /etc/hosts: where that
        # maps the name to loopback, every node is warned about.
        name = socket.gethostname()
        if socket.gethostbyname(name).startswith("127."):
            for i in range(3):
                self.assertRegex(out, r"warning: node %d \(\S+\): hostname '%s' resolves to "
                                 r"127\.[\d.]+.* \(loopback\)" % (i, re.escape(name)))
        else:
            self.assertNotIn("(loopback)", out)


class Pdsh(ClusterTest):
    def test_pdsh_restarts_a_failed_job_on_the_same_agents(self):
        # Generation 0: rank 5 fails; generation 1 runs on the agents pdsh
        # started once (no second pdsh).
        script = ('if [ "$DSLAUNCH_RESTART_COUNT" = 0 ]; then exec %s %s fail 5 exit9; fi; '
                  'echo "generation $DSLAUNCH_RESTART_COUNT rank $RANK"' % (PY, RANK_PY))
        p = self.run_job(self.pdsh_args(extra=["--max_restarts", "1", "--restart_backoff", "0",
                                               "--log_level", "info"]) +
                         ["/bin/sh", "-c", script], timeout=90)
        out, err = p.stdout.decode(), p.stderr.decode()
        self.assertEqual(p.returncode, 0, err[-3000:])
        self.assertIn("rank 5 on %s exited with code 9; stopping every rank, then restart 1 "
                      "of 1" % CLUSTER["nodes"][2], err)
        for rank in range(6):
            self.assertIn("generation 1 rank %d" % rank, out)
        self.assertEqual(err.count("agents started on 3 nodes"), 1, err[-3000:])

    def test_pdsh_places_every_rank_and_authenticates_each_agent(self):
        keys = ["RANK", "NODE_RANK", "LOCAL_RANK", "WORLD_SIZE"]
        p = self.run_job(self.pdsh_args(ENV_KEYS=json.dumps(keys)) +
                         [PY, RANK_PY, "env", "a b", "$(x)"])
        self.assertEqual(p.returncode, 0, p.stderr.decode())
        for rank in range(6):
            with open(os.path.join(self.out, "env-%d.json" % rank)) as f:
                env = json.load(f)
            self.assertEqual(env["__address__"], CLUSTER["nodes"][rank // 2])
            self.assertEqual(env["NODE_RANK"], str(rank // 2))
            with open(os.path.join(self.out, "argv-%d.json" % rank)) as f:
                self.assertEqual(json.load(f), ["a b", "$(x)"])

    def test_pdsh_job_fails_fast_across_nodes(self):
        p = self.run_job(self.pdsh_args() + [PY, RANK_PY, "fail", "1", "exit4"], timeout=60)
        self.assertEqual(p.returncode, 4, p.stderr.decode())
        self.assertIn("stopped in consequence: 5 ranks", p.stderr.decode())

    def test_pdsh_preflight_finds_a_missing_agent(self):
        p = self.run_job(self.pdsh_args(extra=["--agent_path", "/nonexistent/dsagent"]) +
                         ["true"], timeout=60)
        self.assertEqual(p.returncode, 69, p.stderr.decode())
        self.assertIn("/nonexistent/dsagent is missing on the node", p.stderr.decode())
        self.assertIn("started nothing", p.stderr.decode())


class OpenMpiAcrossNamespaces(ClusterTest):
    """mpirun reaches the nodes over OpenSSH (the cluster's ssh_config) and
    starts its daemons there; the ranks are MPI processes of one world."""

    def test_mpi_world_equals_dslaunchs_across_three_nodes(self):
        need_mpi(self)
        hostile = ["a b", "'q'", "$(touch /tmp/pwned-m)", "`id`", "*", "x\ny", ""]
        p = self.run_mpi(self.mpirun_args() + [SYSTEM_PY, MPI_RANK_PY, "ok", *hostile],
                         timeout=120)
        self.assertEqual(p.returncode, 0, p.stderr.decode())
        for rank in range(6):
            with open(os.path.join(self.out, "mpi-%d.json" % rank)) as f:
                r = json.load(f)
            self.assertEqual((r["mpi_rank"], r["mpi_size"], r["sum"]), (rank, 6, 15))
            self.assertEqual(r["env"]["RANK"], str(rank))
            self.assertEqual(r["env"]["NODE_RANK"], str(rank // 2))
            self.assertEqual(r["env"]["OMPI_COMM_WORLD_LOCAL_RANK"], str(rank % 2))
            self.assertEqual(r["address"], CLUSTER["nodes"][rank // 2])
            self.assertIsNone(r["env"]["DSLAUNCH_AGENT_SECRET"])
            self.assertIsNone(r["env"]["DSLAUNCH_MPI_KEY"])
            self.assertEqual(r["argv"][1:], ["ok", *hostile])
        self.assertFalse(os.path.exists("/tmp/pwned-m"))

    def test_a_rank_failing_on_node_2_stops_every_node(self):
        need_mpi(self)
        p = self.run_mpi(self.mpirun_args() + [SYSTEM_PY, MPI_RANK_PY, "fail", "3"],
                         timeout=120)
        err = p.stderr.decode()
        self.assertEqual(p.returncode, 7, err)
        self.assertIn("FAILED: rank 3 on %s" % CLUSTER["nodes"][1], err)
        self.assertIn("stopped in consequence: 5 ranks", err)
        self.assertNotIn("exiting improperly", err)

    def test_a_mapping_that_is_not_the_plans_is_refused_and_says_so(self):
        need_mpi(self)
        argv = self.mpirun_args()
        argv[-1] += " --map-by node"  # later than ours: mpirun takes it
        p = self.run_mpi(argv + [SYSTEM_PY, MPI_RANK_PY], timeout=120)
        err = p.stderr.decode()
        self.assertNotEqual(p.returncode, 0, err)
        self.assertIn("mpirun placed MPI rank", err)
        self.assertIn("--launcher_args", err)
        self.assertFalse([n for n in os.listdir(self.out) if n.startswith("mpi-")])


    def test_a_restart_is_a_new_mpirun_across_the_nodes(self):
        need_mpi(self)
        p = self.run_mpi(self.mpirun_args(extra=("--max_restarts", "1")) +
                         [SYSTEM_PY, MPI_RANK_PY, "fail_first", "3"], timeout=120)
        err = p.stderr.decode()
        self.assertEqual(p.returncode, 0, err)
        self.assertIn("exited with code 7", err)
        self.assertIn("starting a new mpirun for the next generation", err)
        self.assertIn("after 1 restart", err)
        for rank in range(6):
            with open(os.path.join(self.out, "mpi-%d.json" % rank)) as f:
                r = json.load(f)
            self.assertEqual((r["mpi_rank"], r["mpi_size"], r["sum"]), (rank, 6, 15))
            self.assertEqual(r["env"]["DSLAUNCH_RESTART_COUNT"], "1")

class DeepSpeedScriptAcrossNamespaces(ClusterTest):
    def test_a_deepspeed_script_in_a_venv_gets_deepspeeds_own_losses(self):
        deepspeed_env.need_deepspeed(self)
        # The venv is on no node's login PATH: only our environment names it.
        login = subprocess.run(["ssh", "-F", CLUSTER["CLUSTER_SSH_CONFIG"], CLUSTER["nodes"][1],
                                "echo $PATH"], capture_output=True, timeout=30)
        self.assertEqual(login.returncode, 0, login.stderr.decode())
        self.assertNotIn(deepspeed_env.VENV, login.stdout.decode())
        argv = [a for a in self.ssh_args() if a != "--no_local_rank"]
        # The script as `deepspeed train.py --deepspeed_config ...` gets it.
        # The nodes share one hostname, which resolves to loopback: each
        # agent gives its ranks GLOO_SOCKET_IFNAME (the interface toward
        # MASTER_ADDR), so none is set here.
        logs = os.path.join(self.dir, "logs")
        p = self.run_job(argv + ["--log_dir", logs] + deepspeed_env.script_args(self.out),
                         timeout=600, **deepspeed_env.activated())
        self.assertEqual(p.returncode, 0, p.stderr.decode()[-3000:])
        deepspeed_env.check_same_losses(self, self.out, world=6, local_size=2)
        # The unchanged script's steps, reported by the progress hook from
        # every node.
        deepspeed_env.check_hook_records(self, self.out, logs, world=6)
        self.assertNotIn("progress hook", p.stderr.decode())


class PyTorchAcrossNamespaces(ClusterTest):
    def test_ddp_gloo_allreduce_across_three_nodes(self):
        cluster_env.need_torch(self)
        script = os.path.join(os.path.dirname(RANK_PY), "ddp_allreduce.py")
        argv = [a for a in self.ssh_args() if a != "--no_local_rank"]
        # The nodes share one hostname (only the network namespace
        # differs), which resolves to loopback; without GLOO_SOCKET_IFNAME
        # Gloo would pick lo. The agents set it (issue 12).
        self.assertNotIn("GLOO_SOCKET_IFNAME", os.environ)
        p = self.run_job(argv + ["--master_port", "29641", "/usr/bin/python3", script],
                         timeout=300, OMP_NUM_THREADS="1")
        self.assertEqual(p.returncode, 0, p.stderr.decode()[-3000:])
        for rank in range(6):
            self.assertIn("rank %d/6 allreduce ok sum=21.0 ddp ok" % rank, p.stdout.decode())


if __name__ == "__main__":
    unittest.main()
