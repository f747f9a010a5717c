"""SLURM tests: a real SLURM cluster on this machine (slurmctld in a
namespace of its own, a slurmd in each of 3 node namespaces, each node with
its own hostname and /etc/hosts, one munged), built by cluster.sh with
CLUSTER_SLURM=1. dslaunch runs inside salloc and sbatch allocations of 3
nodes x 2 tasks, as users run it, and starts its agents as an srun step.
Needs root and Debian's slurm-wlm and munge; skips itself with a message
otherwise (fails under CI=1). Every test checks that nothing but slurmd is
left on any node afterwards and that no job is left in the queue."""
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "../integration"))
from harness import DSLAUNCH, MPI_RANK_PY, PY, RANK_PY, SYSTEM_PY, LaunchTest, need_mpi  # noqa: E402,E501

import cluster_env  # noqa: E402
import secret_hunt  # noqa: E402
import soak_restarts  # noqa: E402
import deepspeed_env  # noqa: E402
from cluster_env import CLUSTER_SH  # noqa: E402
CLUSTER = {}
HOSTILE = ["a b", "'q'", '"dq"', "$(touch /tmp/pwned-s)", "`id`", "*", "x\ny", "", "\\"]
SLURM_TASK_KEYS = ["SLURM_PROCID", "SLURM_LOCALID", "SLURM_NODEID", "SLURM_NTASKS",
                   "SLURM_NPROCS", "SLURM_GTIDS"]


def setUpModule():
    CLUSTER.update(cluster_env.up(3, "dsl-slurm-", CLUSTER_SLURM="1", CLUSTER_SSHD="0"))
    CLUSTER["names"] = CLUSTER["CLUSTER_NODE_NAMES"].split()
    CLUSTER["nodes"] = CLUSTER["CLUSTER_NODES"].split()


def tearDownModule():
    cluster_env.down(CLUSTER)


def login(*argv):
    """argv run on the cluster's login node (hostname, /etc/hosts, SLURM_CONF)."""
    return [CLUSTER_SH, "login", CLUSTER["dir"], *argv]


class SlurmTest(LaunchTest):
    def salloc(self, *argv, nodes=3, per_node=2):
        return login("salloc", "-N%d" % nodes, "--ntasks-per-node=%d" % per_node, *argv)

    def node_pids(self, i):
        """Live pids in node i's namespace other than its slurmd."""
        with open(os.path.join(CLUSTER["dir"], "node%d.init" % i)) as f:
            slurmd = int(f.read())
        p = subprocess.run([CLUSTER_SH, "pids", CLUSTER["dir"], str(i)],
                           capture_output=True, timeout=30)
        # An empty answer from a failed command would read as "nothing left".
        self.assertEqual(p.returncode, 0, "cluster.sh pids %d: %s" % (i, p.stderr.decode()))
        return [x for x in (int(x) for x in p.stdout.split()) if x != slurmd and self.alive(x)]

    def queue(self):
        p = subprocess.run(login("squeue", "-h", "-o", "%i %T"), capture_output=True,
                           timeout=30)
        self.assertEqual(p.returncode, 0, p.stderr.decode())
        return p.stdout.decode().split("\n")[:-1]

    def tearDown(self):
        # slurmstepd of a finished step may take a moment to go.
        deadline = time.monotonic() + 15
        for i in range(1, 4):
            while self.node_pids(i):
                if time.monotonic() > deadline:
                    left = self.node_pids(i)
                    comms = []
                    for pid in left:
                        try:
                            with open("/proc/%d/cmdline" % pid) as f:
                                comms.append("%d(%s)" % (pid, f.read().replace("\0", " ")[:80]))
                        except OSError:
                            pass
                    self.fail("processes left on node %d: %s" % (i, comms))
                time.sleep(0.1)
        while self.queue():
            self.assertLess(time.monotonic(), deadline, "jobs left: %s" % self.queue())
            time.sleep(0.1)
        super().tearDown()


class Placement(SlurmTest):
    def srun_task_env(self):
        """What srun itself gives the tasks of the same shape (3 x 2)."""
        tasks = {}
        with open(os.path.join(self.out, "srun-env")) as f:
            for line in f:
                task, _, kv = line.rstrip("\n").partition(": ")
                key, _, value = kv.partition("=")
                tasks.setdefault(int(task), {})[key] = value
        return tasks

    def check_ranks(self, envs):
        srun = self.srun_task_env()
        self.assertEqual(len(srun), 6, "srun's own 3 x 2 step")
        for rank, env in enumerate(envs):
            node = rank // 2
            self.assertEqual(env["__address__"], CLUSTER["nodes"][node], "rank %d placement" % rank)
            self.assertEqual(env["HOSTNAME_SEEN"], CLUSTER["names"][node])
            self.assertEqual(env["RANK"], str(rank))
            self.assertEqual(env["NODE_RANK"], str(node))
            self.assertEqual(env["LOCAL_RANK"], str(rank % 2))
            self.assertEqual(env["WORLD_SIZE"], "6")
            self.assertEqual(env["MASTER_ADDR"], CLUSTER["nodes"][0])
            self.assertEqual(env["SLURM_JOB_NODELIST"], "%s[1-3]" % CLUSTER["names"][0][:-1])
            # Exactly what srun --ntasks-per-node=2 gives the same task.
            for key in SLURM_TASK_KEYS:
                self.assertEqual(env[key], srun[rank].get(key), "rank %d %s" % (rank, key))
            self.assertEqual(srun[rank].get("SLURMD_NODENAME"), CLUSTER["names"][node])
        for argv in self.rank_files("argv"):
            self.assertEqual(argv, HOSTILE)
        self.assertFalse(os.path.exists("/tmp/pwned-s"))

    def job_script(self):
        """Runs srun's own 3 x 2 step for comparison, then dslaunch."""
        keys = ["RANK", "NODE_RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR",
                "SLURM_JOB_NODELIST", "HOSTNAME_SEEN", *SLURM_TASK_KEYS]
        script = os.path.join(self.dir, "job.sh")
        with open(script, "w") as f:
            f.write("#!/bin/sh\n"
                    "srun -l --ntasks-per-node=2 env > %s/srun-env\n"
                    'exec "$@"\n' % self.out)
        os.chmod(script, 0o755)
        probe = os.path.join(self.dir, "probe.sh")
        with open(probe, "w") as f:
            f.write('#!/bin/sh\nHOSTNAME_SEEN=$(hostname) exec "$@"\n')
        os.chmod(probe, 0o755)
        return [script, DSLAUNCH, "--no_local_rank", probe, PY, RANK_PY, "env", *HOSTILE], keys

    def test_salloc_places_ranks_with_the_task_variables_srun_gives(self):
        argv, keys = self.job_script()
        p = self.run_job(self.salloc(*argv), ENV_KEYS=json.dumps(keys))
        err = p.stderr.decode()
        self.assertEqual(p.returncode, 0, err)
        self.assertIn("SLURM job ", err)
        self.assertIn(": 3 nodes from SLURM_JOB_NODELIST, ranks 2 per node from "
                      "SLURM_TASKS_PER_NODE (inside the allocation: --launcher slurm)", err)
        self.check_ranks(self.rank_files("env"))

    def test_sbatch_runs_the_same_from_a_batch_script(self):
        argv, keys = self.job_script()
        batch = os.path.join(self.dir, "batch.sh")
        log = os.path.join(self.dir, "batch.out")
        with open(batch, "w") as f:
            f.write("#!/bin/sh\n#SBATCH -N 3\n#SBATCH --ntasks-per-node=2\n#SBATCH -o %s\n"
                    "%s\n" % (log, " ".join("'%s'" % a.replace("'", "'\\''") for a in argv)))
        p = self.run_job(login("sbatch", "--wait", batch), ENV_KEYS=json.dumps(keys))
        with open(log) as f:
            out = f.read()
        self.assertEqual(p.returncode, 0, p.stderr.decode() + out)
        self.assertIn("all 6 ranks on 3 nodes exited 0", out)
        self.check_ranks(self.rank_files("env"))

    def test_ranks_per_node_come_from_num_gpus_over_the_allocation(self):
        keys = ["RANK", "NODE_RANK", "SLURM_PROCID", "SLURM_NTASKS", "CUDA_VISIBLE_DEVICES"]
        p = self.run_job(self.salloc(DSLAUNCH, "--num_gpus", "1", "--num_nodes", "2",
                                     "--no_local_rank", PY, RANK_PY, "env"),
                         ENV_KEYS=json.dumps(keys))
        err = p.stderr.decode()
        self.assertEqual(p.returncode, 0, err)
        self.assertIn("ranks 1 per node from --num_gpus", err)
        envs = self.rank_files("env", world=2)
        self.assertEqual([e["NODE_RANK"] for e in envs], ["0", "1"])
        self.assertEqual([e["SLURM_PROCID"] for e in envs], ["0", "1"])
        self.assertEqual(envs[1]["SLURM_NTASKS"], "2")
        self.assertEqual(envs[1]["CUDA_VISIBLE_DEVICES"], "0")


class SbatchWrapper(SlurmTest):
    def test_the_wrapper_users_copy_runs_a_python_script_on_every_node(self):
        """deploy/slurm/dslaunch.sbatch with its EDIT lines edited as a user
        would: 3 nodes x 2 ranks, 2 (fake) GPUs per node, a venv-less python
        script run by the python3 first on PATH."""
        src = os.path.join(os.path.dirname(CLUSTER_SH), "../../deploy/slurm/dslaunch.sbatch")
        with open(src) as f:
            text = f.read()
        script = os.path.join(self.dir, "train.py")
        with open(script, "w") as f:
            f.write("import json, os, socket, sys\n"
                    "r = os.environ['RANK']\n"
                    "json.dump({'argv': sys.argv, 'host': socket.gethostname(),\n"
                    "           'exe': sys.executable, 'cwd': os.getcwd(),\n"
                    "           'cuda': os.environ.get('CUDA_VISIBLE_DEVICES')},\n"
                    "          open(os.path.join(os.environ['OUT_DIR'], 'py-%s.json' % r), 'w'))\n")
        log = os.path.join(self.dir, "wrapper.out")
        edits = {"--nodes=2": "--nodes=3", "--ntasks-per-node=4": "--ntasks-per-node=2",
                 "--gpus-per-node=4": "--gpus-per-node=2", "--cpus-per-task=8": "--cpus-per-task=1",
                 "--time=02:00:00": "--time=00:05:00", "--output=%x-%j.out": "--output=" + log,
                 "exec dslaunch": "exec " + DSLAUNCH,
                 "train.py --deepspeed --deepspeed_config ds_config.json":
                     script + " --deepspeed --deepspeed_config ds_config.json"}
        for old, new in edits.items():
            self.assertIn(old, text)
            text = text.replace(old, new)
        batch = os.path.join(self.dir, "dslaunch.sbatch")
        with open(batch, "w") as f:
            f.write(text)
        p = self.run_job(login("sbatch", "--wait", "--chdir", self.dir, batch),
                         LOG_DIR=os.path.join(self.dir, "logs"))
        with open(log) as f:
            out = f.read()
        self.assertEqual(p.returncode, 0, p.stderr.decode() + out)
        self.assertIn("all 6 ranks on 3 nodes exited 0", out)
        python3 = shutil.which("python3")
        for rank in range(6):
            with open(os.path.join(self.out, "py-%d.json" % rank)) as f:
                got = json.load(f)
            self.assertEqual(got["host"], CLUSTER["names"][rank // 2])
            self.assertEqual(got["argv"], [script, "--local_rank=%d" % (rank % 2), "--deepspeed",
                                           "--deepspeed_config", "ds_config.json"])
            self.assertEqual(got["exe"], python3)
            self.assertEqual(got["cwd"], self.dir)
            self.assertEqual(got["cuda"], "0,1")
            self.assertTrue(os.path.exists(os.path.join(self.dir, "logs", "rank-%d.log" % rank)))


class Failures(SlurmTest):
    def test_a_failing_rank_ends_the_job_on_every_node(self):
        p = self.run_job(self.salloc(DSLAUNCH, "--no_local_rank", PY, RANK_PY, "fail", "5",
                                     "exit9"), timeout=60)
        err = p.stderr.decode()
        self.assertEqual(p.returncode, 9, err)
        self.assertIn("FAILED: rank 5 on %s" % CLUSTER["names"][2], err)
        self.assertIn("all gone", err)

    def test_a_failed_generation_restarts_in_the_same_srun_step(self):
        script = ('if [ "$DSLAUNCH_RESTART_COUNT" = 0 ]; then exec %s %s fail 5 exit9; fi; '
                  'echo "generation $DSLAUNCH_RESTART_COUNT rank $RANK step $SLURM_STEP_ID"'
                  % (PY, RANK_PY))
        p = self.run_job(self.salloc(DSLAUNCH, "--no_local_rank", "--max_restarts", "1",
                                     "--restart_backoff", "0", "/bin/sh", "-c", script),
                         timeout=90)
        out, err = p.stdout.decode(), p.stderr.decode()
        self.assertEqual(p.returncode, 0, err[-3000:])
        self.assertIn("then restart 1 of 1", err)
        steps = set(re.findall(r"generation 1 rank \d step (\S+)", out))
        self.assertEqual(len(re.findall(r"generation 1 rank \d", out)), 6, out[-3000:])
        self.assertEqual(len(steps), 1, steps)  # one srun step for both generations

    def test_a_node_whose_step_daemons_are_killed_gets_its_agent_in_a_new_step(self):
        """Node 3's slurmstepd and our agent under it are SIGKILLed, as a
        node failure ends them (killing slurmstepd alone ends nothing of the
        job: the agent goes on). The other agents stay in the first step; once
        no rank runs, node 3's agent is started again in a step of its own,
        and the next generation runs on all three nodes."""
        script = ('if [ "$DSLAUNCH_RESTART_COUNT" = 0 ]; then exec %s %s sleep; fi; '
                  'echo "generation $DSLAUNCH_RESTART_COUNT rank $RANK of $WORLD_SIZE '
                  'on $(hostname) step $SLURM_STEP_ID"' % (PY, RANK_PY))
        job = self.start_job(self.salloc(
            DSLAUNCH, "--no_local_rank", "--max_restarts", "1", "--restart_backoff", "0",
            "--heartbeat_interval", "0.3", "--heartbeat_timeout", "2",
            "/bin/sh", "-c", script))
        self.addCleanup(lambda: job.poll() is None and job.kill())
        self.wait_started(6)
        stepd, agent = [], []
        procs = {}
        for pid in self.node_pids(3):
            try:
                with open("/proc/%d/stat" % pid) as f:
                    procs[pid] = f.read()
            except OSError:
                pass
        for pid, stat in procs.items():
            comm, ppid = stat[stat.index("(") + 1:stat.rindex(")")], int(
                stat[stat.rindex(")") + 2:].split()[1])
            if comm == "slurmstepd":
                stepd.append(pid)
        for pid, stat in procs.items():  # the agent srun started (not its guard)
            comm, ppid = stat[stat.index("(") + 1:stat.rindex(")")], int(
                stat[stat.rindex(")") + 2:].split()[1])
            if comm == "dsagent" and ppid in stepd:
                agent.append(pid)
        self.assertEqual((len(stepd), len(agent)), (1, 1), procs)
        stepd += agent
        for pid in stepd:
            os.kill(pid, signal.SIGKILL)
        out, err = job.communicate(timeout=90)
        out, err = out.decode(), err.decode()
        self.assertEqual(job.returncode, 0, err[-3000:])
        name = CLUSTER["names"][2]
        self.assertIn("node 2 (%s) was lost" % name, err)
        self.assertIn("starting the agent of node 2 (%s) again" % name, err)
        self.assertIn("node 2 (%s) is back" % name, err)
        steps = {}
        for rank in range(6):
            m = re.search(r"generation 1 rank %d of 6 on %s step (\S+)" % (
                rank, CLUSTER["names"][rank // 2]), out)
            self.assertIsNotNone(m, out[-3000:])
            steps[rank] = m.group(1)
        self.assertEqual(len({steps[r] for r in range(4)}), 1, steps)  # the first step
        self.assertNotEqual(steps[4], steps[0], steps)  # node 3's own step
        self.assertEqual(steps[4], steps[5], steps)
        self.assert_no_leftovers(within=15)

    def test_scancel_stops_the_job_like_ctrl_c_and_says_slurm_did(self):
        job = self.start_job(self.salloc(DSLAUNCH, "--no_local_rank", PY, RANK_PY, "sleep"))
        self.wait_started(6)
        jobs = self.queue()
        self.assertEqual(len(jobs), 1, jobs)
        subprocess.run(login("scancel", jobs[0].split()[0]), check=True, timeout=30)
        out, err = job.communicate(timeout=60)
        err = err.decode()
        self.assertEqual(job.returncode, 143, err)  # SLURM's SIGTERM: a preemption
        # SLURM signals the agents and says it cancelled the step, in either
        # order: the report names SLURM either way, never a rank's failure.
        self.assertRegex(err, r"stopped: SLURM (cancelled step|stopped the step)")
        self.assertNotIn("FAILED", err)
        self.assertIn("all gone", err)

    def test_launcher_killed_leaves_nothing_on_any_node(self):
        pidfile = os.path.join(self.dir, "launcher.pid")
        job = self.start_job(self.salloc(
            "/bin/sh", "-c", 'echo $$ > "$0"; exec "$@"', pidfile,
            DSLAUNCH, "--no_local_rank", PY, RANK_PY, "sleep"))
        self.wait_started(6)
        with open(pidfile) as f:
            os.kill(int(f.read()), signal.SIGKILL)
        # (salloc's own exit status then is SLURM's business.)
        job.communicate(timeout=60)
        self.assert_no_leftovers(within=15)


class TrainingSurvivesFaults(SlurmTest):
    """dsworker with a checkpoint every 10 steps inside salloc -N3, one fault
    at a random moment: the job ends 0, every loss after the restart equals
    the uninterrupted run's bit for bit, nothing is left on any node. The
    seed is printed; DSLAUNCH_TEST_SEED repeats a run."""

    @classmethod
    def setUpClass(cls):
        cls.work = tempfile.mkdtemp(prefix="dsl-train-")
        soak_restarts.prepare(cls.work)
        cls.whole = soak_restarts.uninterrupted(soak_restarts.SlurmSite(CLUSTER), cls.work)
        cls.runs = 0

    @classmethod
    def tearDownClass(cls):
        subprocess.run(["rm", "-rf", cls.work], timeout=60)

    def check(self, fault):
        TrainingSurvivesFaults.runs += 1
        soak_restarts.assert_survives(self, soak_restarts.SlurmSite(CLUSTER), self.work,
                                      self.whole, self.runs, fault)

    def test_a_nodes_step_daemons_killed(self):
        self.check("node daemons")

    def test_a_frozen_agent(self):
        self.check("agent SIGSTOP")


class Hostlists(SlurmTest):
    def test_node_lists_expand_as_scontrol_expands_them(self):
        # (SLURM refuses a suffix after the last bracket group, `n[1-2].c`;
        # dslaunch takes it, as in a hostfile.)
        lists = ["n1", "gpu-a[001-003,010],gpu-b7", "r[1-2]n[08-11]", "a[1,3-5],b[09-11]",
                 "x[0-3]-y[5,7]", "rack[1-2]-node[1,3]", "node[7-12,003]"]
        for hostlist in lists:
            with self.subTest(hostlist=hostlist):
                want = subprocess.run(login("scontrol", "show", "hostnames", hostlist),
                                      capture_output=True, timeout=30)
                self.assertEqual(want.returncode, 0, want.stderr.decode())
                p = self.run_job([DSLAUNCH, "--launcher", "slurm", "--dry-run", "true"],
                                 SLURM_JOB_ID="1", SLURM_JOB_NODELIST=hostlist,
                                 SLURM_TASKS_PER_NODE="")
                self.assertEqual(p.returncode, 0, p.stderr.decode())
                # The plan table: a header, a row per rank, a summary line.
                rows = [line.split() for line in p.stdout.decode().splitlines()[1:-1]]
                self.assertEqual([r[0] for r in rows], want.stdout.decode().split())


class OpenMpiInsideTheAllocation(SlurmTest):
    """--launcher openmpi inside salloc: mpirun runs over the allocation and
    starts its daemons with srun (--overlap added by dslaunch)."""

    def test_mpi_world_equals_dslaunchs_on_the_allocations_nodes(self):
        need_mpi(self)
        p = self.run_job(self.salloc(DSLAUNCH, "--launcher", "openmpi", "--no_local_rank",
                                     SYSTEM_PY, MPI_RANK_PY, "ok", *HOSTILE), timeout=120)
        err = p.stderr.decode()
        self.assertEqual(p.returncode, 0, err)
        self.assertIn("mpirun runs over the allocation", err)
        for rank in range(6):
            with open(os.path.join(self.out, "mpi-%d.json" % rank)) as f:
                r = json.load(f)
            node = rank // 2
            self.assertEqual((r["mpi_rank"], r["mpi_size"], r["sum"]), (rank, 6, 15))
            self.assertEqual(r["host"], CLUSTER["names"][node])
            self.assertEqual(r["address"], CLUSTER["nodes"][node])
            self.assertEqual(r["env"]["RANK"], str(rank))
            # As under --launcher slurm: srun's per-task variables of the rank.
            self.assertEqual(r["env"]["SLURM_PROCID"], str(rank))
            self.assertIsNone(r["env"]["DSLAUNCH_AGENT_SECRET"])
            self.assertIsNone(r["env"]["DSLAUNCH_MPI_KEY"])
            self.assertEqual(r["argv"][1:], ["ok", *HOSTILE])
        self.assertFalse(os.path.exists("/tmp/pwned-s"))

    def test_a_failing_rank_ends_the_job_on_every_node(self):
        need_mpi(self)
        p = self.run_job(self.salloc(DSLAUNCH, "--launcher", "openmpi", "--no_local_rank",
                                     SYSTEM_PY, MPI_RANK_PY, "fail", "4"), timeout=120)
        err = p.stderr.decode()
        self.assertEqual(p.returncode, 7, err)
        self.assertIn("FAILED: rank 4 on %s" % CLUSTER["names"][2], err)
        self.assertIn("stopped in consequence: 5 ranks", err)


    def test_a_restart_is_a_new_mpirun_over_the_allocation(self):
        need_mpi(self)
        p = self.run_job(self.salloc(DSLAUNCH, "--launcher", "openmpi", "--no_local_rank",
                                     "--max_restarts", "1", SYSTEM_PY, MPI_RANK_PY,
                                     "fail_first", "4"), timeout=180)
        err = p.stderr.decode()
        self.assertEqual(p.returncode, 0, err)
        self.assertIn("rank 4 on %s exited with code 7" % CLUSTER["names"][2], err)
        self.assertIn("starting a new mpirun for the next generation", err)
        self.assertIn("after 1 restart", err)
        for rank in range(6):
            with open(os.path.join(self.out, "mpi-%d.json" % rank)) as f:
                r = json.load(f)
            self.assertEqual((r["mpi_rank"], r["mpi_size"], r["sum"]), (rank, 6, 15))
            self.assertEqual(r["host"], CLUSTER["names"][rank // 2])
            self.assertEqual(r["env"]["DSLAUNCH_RESTART_COUNT"], "1")
            self.assertEqual(r["env"]["SLURM_PROCID"], str(rank))


class SecretsInLongLivedEnvironments(SlurmTest):
    """srun (and, under --launcher openmpi, mpirun, the srun step it starts
    its daemons with, and the daemons) live as long as the job, and a rank
    of the same user reads their environment: no secret the launcher
    accepts may be there, nor in any other environment a rank can read."""

    RANK = os.path.join(os.path.dirname(RANK_PY), "environ_rank.py")

    def test_under_srun_no_readable_environment_holds_a_usable_secret(self):
        wrapper, log = secret_hunt.agent_wrapper(self)
        p = self.run_job(self.salloc(DSLAUNCH, "--agent_path", wrapper, PY, self.RANK),
                         timeout=120)
        self.assertEqual(p.returncode, 0, p.stderr.decode())
        secret_hunt.check(self, self.out, log, nodes=3, tools=("srun",))

    def test_under_mpirun_no_readable_environment_holds_a_usable_secret(self):
        need_mpi(self)
        wrapper, log = secret_hunt.agent_wrapper(self)
        p = self.run_job(self.salloc(DSLAUNCH, "--launcher", "openmpi", "--agent_path", wrapper,
                                     PY, self.RANK), timeout=120)
        self.assertEqual(p.returncode, 0, p.stderr.decode())
        secret_hunt.check(self, self.out, log, nodes=3, tools=("mpirun", "srun", "orted"),
                          kept=("DSLAUNCH_MPI_KEY",))
        with open(os.path.join(self.out, "environ-0.json")) as f:
            read = {r["comm"] for r in json.load(f)["read"]}
        self.assertTrue({"mpirun", "srun", "orted"} <= read, read)


class DeepSpeedScriptInsideTheAllocation(SlurmTest):
    def test_a_deepspeed_script_in_a_venv_gets_deepspeeds_own_losses(self):
        deepspeed_env.need_deepspeed(self)
        p = self.run_job(self.salloc(DSLAUNCH, *deepspeed_env.script_args(self.out)),
                         timeout=600, **deepspeed_env.activated())
        self.assertEqual(p.returncode, 0, p.stderr.decode()[-3000:])
        deepspeed_env.check_same_losses(self, self.out, world=6, local_size=2)


class HpcRecipes(SlurmTest):
    """examples/hpc/ run as their comments say, with stand-ins where this
    machine lacks the real thing: a `singularity` that runs the command
    without a container, a conda whose env is a venv with DeepSpeed, and a
    DeepSpeed script for the Hugging Face Trainer script (transformers is
    not installed here)."""
    EXAMPLES = os.path.join(os.path.dirname(CLUSTER_SH), "../../examples/hpc")

    def test_lumi_runs_every_rank_in_the_container_offline(self):
        fake = os.path.join(self.dir, "singularity")
        with open(fake, "w") as f:
            f.write('#!/bin/sh\n[ "$1" = exec ] || exit 64\nshift\n'
                    'while [ "$1" = -B ]; do echo "$2" > "$OUT_DIR/binds"; shift 2; done\n'
                    'SINGULARITY_CONTAINER=$1; export SINGULARITY_CONTAINER; shift\n'
                    'exec "$@"\n')
        os.chmod(fake, 0o755)
        keys = ["RANK", "SLURM_NODEID", "TRANSFORMERS_OFFLINE", "HF_DATASETS_OFFLINE",
                "SINGULARITY_CONTAINER"]
        p = self.run_job(self.salloc(os.path.join(self.EXAMPLES, "lumi.sh"), RANK_PY, "env",
                                     "--epochs", "1", nodes=2, per_node=4),
                         timeout=120, DSLAUNCH=DSLAUNCH, CONTAINER=fake, SIF="/images/pt.sif",
                         BINDS="/scratch/p,/project/p", ENV_KEYS=json.dumps(keys))
        self.assertEqual(p.returncode, 0, p.stderr.decode())
        self.assertIn("all 8 ranks on 2 nodes exited 0", p.stderr.decode())
        for rank, env in enumerate(self.rank_files("env", world=8)):
            self.assertEqual(env["__address__"], CLUSTER["nodes"][rank // 4])
            self.assertEqual(env["SLURM_NODEID"], str(rank // 4))
            self.assertEqual(env["TRANSFORMERS_OFFLINE"], "1")
            self.assertEqual(env["HF_DATASETS_OFFLINE"], "1")
            self.assertEqual(env["SINGULARITY_CONTAINER"], "/images/pt.sif")
        for rank, argv in enumerate(self.rank_files("argv", world=8)):
            self.assertEqual(argv, ["--epochs", "1", "--local_rank=%d" % (rank % 4)])
        with open(os.path.join(self.out, "binds")) as f:
            self.assertEqual(f.read().strip(), "/scratch/p,/project/p")

    def fake_conda(self):
        """CONDA_ROOT with etc/profile.d/conda.sh whose `conda activate hf`
        activates envs/hf: a venv that sees the DeepSpeed venv's packages."""
        root = os.path.join(self.dir, "miniconda3")
        env = os.path.join(root, "envs", "hf")
        subprocess.run(["/usr/bin/python3", "-m", "venv", "--system-site-packages",
                        "--without-pip", env], check=True, timeout=120)
        site = subprocess.run([os.path.join(deepspeed_env.VENV, "bin", "python3"), "-c",
                               "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                              capture_output=True, check=True).stdout.decode().strip()
        mine = subprocess.run([os.path.join(env, "bin", "python3"), "-c",
                               "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                              capture_output=True, check=True).stdout.decode().strip()
        with open(os.path.join(mine, "deepspeed_venv.pth"), "w") as f:
            f.write(site + "\n")
        os.makedirs(os.path.join(root, "etc", "profile.d"))
        with open(os.path.join(root, "etc", "profile.d", "conda.sh"), "w") as f:
            f.write('conda() {\n  [ "$1" = activate ] || return 64\n'
                    '  CONDA_PREFIX=%s/envs/$2; CONDA_DEFAULT_ENV=$2\n'
                    '  PATH=$CONDA_PREFIX/bin:$PATH\n'
                    '  export CONDA_PREFIX CONDA_DEFAULT_ENV PATH\n}\n' % root)
        return root, env

    def test_hpc5_batch_job_runs_a_deepspeed_script_from_a_conda_env(self):
        deepspeed_env.need_deepspeed(self)
        root, env = self.fake_conda()
        log = os.path.join(self.dir, "hpc5.out")
        p = self.run_job(login("sbatch", "--wait", "--chdir", self.dir, "--nodes=3",
                               "--ntasks-per-node=2", "--gpus-per-node=2", "--cpus-per-task=1",
                               "--time=00:10:00", "--output=" + log,
                               os.path.join(self.EXAMPLES, "hpc5.sbatch")),
                         timeout=600, DSLAUNCH=DSLAUNCH, CONDA_ROOT=root, CONDA_ENV="hf",
                         TRAIN=deepspeed_env.SCRIPT, OMP_NUM_THREADS="1",
                         TRAIN_ARGS=" ".join(deepspeed_env.script_args(self.out)[1:]))
        with open(log) as f:
            out = f.read()
        self.assertEqual(p.returncode, 0, p.stderr.decode() + out[-3000:])
        self.assertIn("all 6 ranks on 3 nodes exited 0", out)
        want = deepspeed_env.reference(6)
        for rank, record in enumerate(deepspeed_env.read_losses(self.out, 6)):
            self.assertEqual(record["prefix"], env, "rank %d ran the conda env's python" % rank)
            self.assertEqual(record["local_rank_arg"], rank % 2)
            for got, expected in zip(record["losses"], want[rank]):
                self.assertAlmostEqual(got, expected, delta=1e-5 * max(1.0, abs(expected)))
        self.assertTrue(os.path.isdir(os.path.join(self.dir, "logs")))

    def test_mpirun_recipe_gives_an_mpi_script_dslaunchs_world(self):
        need_mpi(self)
        p = self.run_job(self.salloc(os.path.join(self.EXAMPLES, "mpirun.sh"), MPI_RANK_PY, "ok"),
                         timeout=120, DSLAUNCH=DSLAUNCH, DSLAUNCH_PYTHON=SYSTEM_PY)
        self.assertEqual(p.returncode, 0, p.stderr.decode())
        for rank in range(6):
            with open(os.path.join(self.out, "mpi-%d.json" % rank)) as f:
                r = json.load(f)
            self.assertEqual((r["mpi_rank"], r["mpi_size"]), (rank, 6))
            self.assertEqual(r["host"], CLUSTER["names"][rank // 2])


class PyTorchAcrossSlurmNodes(SlurmTest):
    def test_ddp_gloo_allreduce_across_three_nodes(self):
        cluster_env.need_torch(self)
        script = os.path.join(os.path.dirname(RANK_PY), "ddp_allreduce.py")
        # Each node's hostname resolves to its own address, as on a real
        # cluster: no GLOO_SOCKET_IFNAME is needed.
        p = self.run_job(self.salloc(DSLAUNCH, "/usr/bin/python3", script), timeout=300,
                         OMP_NUM_THREADS="1")
        self.assertEqual(p.returncode, 0, p.stderr.decode()[-3000:])
        for rank in range(6):
            self.assertIn("rank %d/6 allreduce ok sum=21.0 ddp ok" % rank, p.stdout.decode())


if __name__ == "__main__":
    unittest.main()
