"""Framework scripts run unchanged under dslaunch across the SSH cluster
(cluster.sh: 3 nodes x 2 ranks, network namespaces with an sshd each):
  - Horovod 0.28.1 built from PyPI's source (PyTorch, Gloo, OpenMPI): ranks
    started as horovodrun --gloo would start them meet through the agents'
    Horovod rendezvous; hvd's world equals dslaunch's, an allreduce sums, a
    second hvd.init() after hvd.shutdown() meets afresh, a failing rank ends
    the job; under --launcher openmpi the same Horovod uses MPI;
  - Accelerate: Accelerator() sees dslaunch's world;
  - a Hugging Face Trainer script: the progress hook reports its steps,
    losses and learning rates, equal to what the Trainer logged, in
    metrics.jsonl, on the console, in TensorBoard and in Prometheus.
The venvs come from deploy/setup.sh --test (frameworks_env.py). Needs root;
skips itself otherwise. Nothing may be left on any node after each test."""
import json
import os
import re
import sys
import time
import unittest
import urllib.request

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "../integration"))
import cluster_env  # noqa: E402
import frameworks_env as fw  # noqa: E402
import test_cluster  # noqa: E402
from harness import need_mpi  # noqa: E402
from test_cluster import ClusterTest  # noqa: E402
from test_prometheus import free_port, parse_metrics  # noqa: E402
from test_tensorboard import f32, need_tensorboard, read_runs  # noqa: E402

CLUSTER = test_cluster.CLUSTER
WORLD = 6


def setUpModule():
    # Each node its own hostname, resolving to its address (CLUSTER_UTS=1):
    # Horovod 0.28's process sets ignore HOROVOD_GLOO_IFACE and bind to the
    # address of the hostname, which on the shared-hostname cluster is
    # loopback; real nodes resolve their own names.
    CLUSTER.update(cluster_env.up(3, "dsl-fw-", CLUSTER_UTS="1"))
    CLUSTER["nodes"] = CLUSTER["CLUSTER_NODES"].split()


def tearDownModule():
    cluster_env.down(CLUSTER)


def horovod_world(rank, mpi):
    """What Horovod must say of rank `rank` of the 3 x 2 job (hvd_rank.py)."""
    return {"rank": rank, "size": WORLD, "local_rank": rank % 2, "local_size": 2,
            "cross_rank": rank // 2, "cross_size": 3, "sum": 21.0, "mpi": mpi,
            "gloo": not mpi}


class HorovodAcrossNamespaces(ClusterTest):
    def test_horovods_world_is_dslaunchs_and_an_allreduce_sums(self):
        fw.need_horovod(self)
        p = self.run_job(self.ssh_args() + [fw.script("hvd_rank.py")], timeout=300,
                         **fw.activated(fw.HOROVOD_VENV))
        self.assertEqual(p.returncode, 0, p.stderr.decode()[-3000:])
        for rank, got in enumerate(self.rank_files("hvd")):
            want = horovod_world(rank, mpi=False)
            # The second hvd.init() met in the same scopes, cleared by the first's end.
            self.assertEqual(got["first"], want)
            self.assertEqual(got["second"], want)
            self.assertEqual(got["env"]["RANK"], str(rank))
            self.assertEqual(got["env"]["LOCAL_RANK"], str(rank % 2))

    def test_a_failing_horovod_rank_ends_the_job_on_every_node(self):
        fw.need_horovod(self)
        start = time.monotonic()
        p = self.run_job(self.ssh_args(FAIL_RANK="3") + [fw.script("hvd_rank.py")],
                         timeout=300, **fw.activated(fw.HOROVOD_VENV))
        err = p.stderr.decode()
        self.assertEqual(p.returncode, 3, err[-3000:])
        self.assertIn("rank 3 fails on purpose", p.stdout.decode())
        self.assertIn("FAILED: rank 3 on %s (node 1, local rank 1" % CLUSTER["nodes"][1], err)
        self.assertIn("exited with code 3", err)
        self.assertLess(time.monotonic() - start, 120)


class HorovodOverMpiAcrossNamespaces(ClusterTest):
    def test_an_mpi_built_horovod_under_the_openmpi_launcher_uses_mpi(self):
        """--launcher openmpi gives no Gloo controller: Horovod (built with
        MPI and Gloo) picks MPI by itself, in the world mpirun made."""
        fw.need_horovod(self, mpi=True)
        need_mpi(self)
        p = self.run_mpi(self.mpirun_args(HVD_REINIT="0") + [fw.script("hvd_rank.py")],
                         timeout=300, **fw.activated(fw.HOROVOD_VENV))
        self.assertEqual(p.returncode, 0, p.stderr.decode()[-3000:])
        for rank, got in enumerate(self.rank_files("hvd")):
            self.assertEqual(got["first"], horovod_world(rank, mpi=True))


class AccelerateAcrossNamespaces(ClusterTest):
    def test_an_accelerator_sees_dslaunchs_world(self):
        fw.need_hf(self)
        p = self.run_job(self.ssh_args() + [fw.script("accelerate_rank.py")], timeout=300,
                         **fw.activated(fw.HF_VENV))
        self.assertEqual(p.returncode, 0, p.stderr.decode()[-3000:])
        for rank, got in enumerate(self.rank_files("accelerate")):
            self.assertEqual(got, {"process_index": rank, "num_processes": WORLD,
                                   "local_process_index": rank % 2,
                                   "is_main_process": rank == 0,
                                   "distributed_type": "DistributedType.MULTI_CPU",
                                   "gathered": list(range(WORLD))})


class HuggingFaceTrainerAcrossNamespaces(ClusterTest):
    STEPS = 6

    def scrape_last_steps(self, job, url, timeout=240):
        """/metrics once every rank reported its last step."""
        deadline = time.monotonic() + timeout
        text = ""
        while time.monotonic() < deadline:
            self.assertIsNone(job.poll(), "the job ended early")
            try:
                with urllib.request.urlopen(url, timeout=5) as r:
                    text = r.read().decode()
            except OSError:
                time.sleep(0.2)
                continue
            got = parse_metrics(text)
            if all(got.get(("dslaunch_rank_step", r)) == self.STEPS for r in range(WORLD)):
                return got
            time.sleep(0.2)
        self.fail("no last step from every rank within %g s:\n%s" % (timeout, text))

    def test_the_trainers_steps_reach_every_view_unchanged(self):
        fw.need_hf(self)
        need_tensorboard(self)
        logs = os.path.join(self.dir, "logs")
        tb = os.path.join(self.dir, "tb")
        port = free_port()
        job = self.start_job(
            self.ssh_args(extra=["--log_dir", logs, "--tensorboard", tb,
                                 "--metrics_port", str(port), "--metrics_addr", "127.0.0.1",
                                 "--console", "lines"], STEPS=str(self.STEPS)) +
            [fw.script("hf_train.py")], **fw.activated(fw.HF_VENV))
        try:
            metrics = self.scrape_last_steps(job, "http://127.0.0.1:%d/metrics" % port)
        finally:
            open(os.path.join(self.out, "release"), "w").close()
        out, err = job.communicate(timeout=120)
        self.assertEqual(job.returncode, 0, err.decode()[-3000:])
        err = err.decode()
        self.assertNotIn("progress hook", err)  # it attached, and said nothing

        with open(os.path.join(logs, "metrics.jsonl")) as f:
            records = [json.loads(line) for line in f if '"step"' in line]
        runs = read_runs(self, *(os.path.join(tb, "rank-%d" % r) for r in range(WORLD)))
        trainer_logs = self.rank_files("hf")  # what the Trainer logged, by the script
        for rank, logged in enumerate(trainer_logs):
            self.assertEqual([x["step"] for x in logged], list(range(1, self.STEPS + 1)))
            mine = [r for r in records if r["rank"] == rank]
            self.assertEqual([r["step"] for r in mine], [x["step"] for x in logged])
            self.assertEqual([r["loss"] for r in mine], [x["loss"] for x in logged])
            self.assertEqual([r["lr"] for r in mine], [x["lr"] for x in logged])
            self.assertEqual(metrics[("dslaunch_rank_loss", rank)], logged[-1]["loss"])
            run = runs[os.path.join(tb, "rank-%d" % rank)]
            self.assertEqual(run["loss"], [[x["step"], f32(x["loss"])] for x in logged])
        # The console's lines show rank 0's records as they came.
        for x in trainer_logs[0]:
            self.assertRegex(err, r":0 progress\] step %d  loss %s " % (
                x["step"], re.escape(repr(x["loss"]))))


if __name__ == "__main__":
    unittest.main()
