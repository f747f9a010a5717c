"""--launcher openmpi on this machine: OpenMPI's mpirun (Debian's openmpi-bin)
starts the agents, and a rank that calls MPI_Init (mpi4py, Debian's
python3-mpi4py in /usr/bin/python3) sees MPI_COMM_WORLD equal to dslaunch's
world. One node here (mpirun would reach 127.0.0.2 over ssh); several nodes
are in tests/cluster (SSH namespaces and SLURM). Skips itself without mpirun
or mpi4py (fails under CI=1)."""
import json
import os
import signal
import time
import unittest

import secret_hunt
from harness import DSLAUNCH, MPI_RANK_PY, SYSTEM_PY, LaunchTest, need_mpi


def job_processes(job_id):
    """Pids whose command line names the job: mpirun and the agents it
    started (--job_id). The ranks are LaunchTest's leftover check."""
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open("/proc/%s/cmdline" % name, "rb") as f:
                if job_id.encode() in f.read():
                    found.append(int(name))
        except OSError:
            pass
    return found


class OpenMpi(LaunchTest):
    def setUp(self):
        need_mpi(self)
        super().setUp()
        self.script = MPI_RANK_PY
        self.hosts = os.path.join(self.dir, "hosts")
        with open(self.hosts, "w") as f:
            f.write("localhost slots=3\n")

    def dslaunch(self, *args, extra=()):
        return [DSLAUNCH, "--hostfile", self.hosts, "--launcher", "openmpi", *extra,
                self.script, *args]

    def results(self, world):
        out = []
        for rank in range(world):
            with open(os.path.join(self.out, "mpi-%d.json" % rank)) as f:
                out.append(json.load(f))
        return out

    def assert_job_gone(self, job_id, within=10):
        deadline = time.monotonic() + within
        while job_processes(job_id):
            if time.monotonic() > deadline:
                self.fail("processes of job %s left: %s" % (job_id, job_processes(job_id)))
            time.sleep(0.1)

    def test_mpi_world_is_dslaunchs_world(self):
        p = self.run_job(self.dslaunch(extra=["--launcher_args", "--mca btl self,tcp"]),
                         DSLAUNCH_PYTHON=SYSTEM_PY)
        err = p.stderr.decode()
        self.assertEqual(p.returncode, 0, err)
        for rank, r in enumerate(self.results(3)):
            self.assertEqual(r["mpi_rank"], rank)
            self.assertEqual(r["mpi_size"], 3)
            self.assertEqual(r["sum"], 3)
            self.assertEqual(r["env"]["RANK"], str(rank))
            self.assertEqual(r["env"]["WORLD_SIZE"], "3")
            self.assertEqual(r["env"]["PMIX_RANK"], str(rank))
            # --launcher_args reached mpirun; the secret reached no rank.
            self.assertEqual(r["env"]["OMPI_MCA_btl"], "self,tcp")
            self.assertIsNone(r["env"]["DSLAUNCH_AGENT_SECRET"])
            self.assertIsNone(r["env"]["DSLAUNCH_MPI_KEY"])
            # A .py script runs as DeepSpeed runs it, under every mode.
            self.assertEqual(r["argv"][1:], ["--local_rank=%d" % rank])  # then ARGS
        out = p.stdout.decode()
        for rank in range(3):
            self.assertIn("[localhost:%d] mpi rank %d of 3" % (rank, rank), out)
        self.assertIn("all 3 ranks on 1 node exited 0", err)
        self.assertNotIn("mpirun", err)  # nothing of the tool's chatter
        self.assert_job_gone(self.results(1)[0]["env"]["DSLAUNCH_JOB_ID"])

    def test_no_process_a_rank_can_read_holds_a_secret_the_launcher_accepts(self):
        # mpirun lives as long as the job, its environment readable by every
        # rank of the same user: it holds the MPI key only, which the
        # launcher refuses; each agent's own secret is in no environment.
        wrapper, log = secret_hunt.agent_wrapper(self)
        self.script = os.path.join(os.path.dirname(MPI_RANK_PY), "environ_rank.py")
        p = self.run_job(self.dslaunch(extra=["--agent_path", wrapper]), timeout=120,
                         DSLAUNCH_PYTHON=SYSTEM_PY)
        self.assertEqual(p.returncode, 0, p.stderr.decode())
        secret_hunt.check(self, self.out, log, nodes=1, tools=("mpirun", "orterun"),
                          kept=("DSLAUNCH_MPI_KEY",), given=("DSLAUNCH_PYTHON",))
        self.assertNotIn("DSLAUNCH-SECRET", p.stdout.decode() + p.stderr.decode())

    def test_a_rank_failing_stops_the_others_and_its_code_is_the_exit(self):
        p = self.run_job(self.dslaunch("fail", "1"), timeout=60, DSLAUNCH_PYTHON=SYSTEM_PY)
        err = p.stderr.decode()
        self.assertEqual(p.returncode, 7, err)
        self.assertIn("FAILED: rank 1 on localhost (node 0, local rank 1", err)
        self.assertIn("exited with code 7", err)
        self.assertIn("rank 0 (localhost", err)
        self.assertIn("rank 2 (localhost", err)
        self.assertLess(p.elapsed, 20)
        # mpirun's own account of the teardown stays out of the report.
        self.assertNotIn("exiting improperly", err)
        self.assert_job_gone(self.results(1)[0]["env"]["DSLAUNCH_JOB_ID"])

    def test_a_restart_is_a_new_mpirun_whose_world_is_whole(self):
        p = self.run_job(self.dslaunch("fail_first", "1", extra=("--max_restarts", "2")),
                         timeout=90, DSLAUNCH_PYTHON=SYSTEM_PY)
        err = p.stderr.decode()
        self.assertEqual(p.returncode, 0, err)
        self.assertIn("exited with code 7", err)
        self.assertIn("starting a new mpirun for the next generation, on node 0 (localhost)",
                      err)
        self.assertIn("restart 1 of 2", err)
        # The second generation's ranks are a whole MPI world of their own.
        results = self.results(3)
        for rank, r in enumerate(results):
            self.assertEqual((r["mpi_rank"], r["mpi_size"], r["sum"]), (rank, 3, 3), r)
            self.assertEqual(r["env"]["DSLAUNCH_RESTART_COUNT"], "1", r)
        self.assert_job_gone(results[0]["env"]["DSLAUNCH_JOB_ID"])

    def test_ranks_that_are_no_mpi_processes_restart_in_a_new_mpirun_too(self):
        # mpirun never hears of a rank that does not MPI_Init: the ended
        # generation's agents wait until they are told to end, then a new
        # mpirun starts every node's agent again.
        script = ('echo "gen ${DSLAUNCH_RESTART_COUNT:-0} rank $RANK"; '
                  'if [ "${DSLAUNCH_RESTART_COUNT:-0}" = 0 ]; then '
                  '[ "$RANK" = 1 ] && exit 7; sleep 30; fi')
        p = self.run_job([DSLAUNCH, "--hostfile", self.hosts, "--launcher", "openmpi",
                          "--max_restarts", "1", "--console", "lines", "bash", "-c", script],
                         timeout=60)
        out, err = p.stdout.decode(), p.stderr.decode()
        self.assertEqual(p.returncode, 0, err)
        self.assertIn("starting a new mpirun for the next generation", err)
        self.assertIn("after 1 restart", err)
        for rank in range(3):
            self.assertIn("gen 1 rank %d" % rank, out)
        self.assertLess(p.elapsed, 20)  # the first generation's sleeps were cut

    def test_ctrl_c_stops_every_rank_and_mpirun(self):
        job = self.start_job(self.dslaunch("sleep"), DSLAUNCH_PYTHON=SYSTEM_PY)
        self.read_until(job, "stdout", r"mpi rank \d of 3", count=3, timeout=30)
        job.send_signal(signal.SIGINT)
        _, err = job.communicate(timeout=30)
        self.assertEqual(job.returncode, 130, err.decode())
        self.assertIn("interrupted (SIGINT)", err.decode())
        self.assert_job_gone(self.results(1)[0]["env"]["DSLAUNCH_JOB_ID"])

    def test_what_mpirun_says_when_it_cannot_start_reaches_the_user(self):
        with open(self.hosts, "w") as f:
            f.write("localhost slots=1\nno-such-node.invalid slots=1\n")
        p = self.run_job(self.dslaunch(), timeout=60, DSLAUNCH_PYTHON=SYSTEM_PY)
        err = p.stderr.decode()
        self.assertEqual(p.returncode, 69, err)
        self.assertIn("[mpirun agent]", err)
        self.assertIn("no-such-node", err)
        self.assertIn("ended with mpirun, which exited with code", err)


    def test_ssh_ports_and_users_in_the_hostfile_are_refused_not_dropped(self):
        with open(self.hosts, "w") as f:
            f.write("localhost slots=2 port=2222\n")
        p = self.run_job(self.dslaunch(), DSLAUNCH_PYTHON=SYSTEM_PY)
        err = p.stderr.decode()
        self.assertEqual(p.returncode, 64, err)
        self.assertIn("localhost an ssh port or user", err)
        self.assertIn("~/.ssh/config", err)

if __name__ == "__main__":
    unittest.main()
