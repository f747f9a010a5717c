"""dsworker through dslaunch: the same training steps give the same losses at
1 and 2 ranks under ZeRO stages 0 and 1, and model_state_bytes follows the
stage's formula. A tiny model on a tiny corpus, a few seconds."""
import json
import os
import re
import select
import signal
import subprocess
import time
import unittest

from harness import DSLAUNCH, LaunchTest

DSWORKER = os.path.join(os.path.dirname(DSLAUNCH), "dsworker")
CORPUS = ("In the beginning God created the heaven and the earth. And the earth was "
          "without form, and void; and darkness was upon the face of the deep. ") * 300


class WorkerTest(LaunchTest):
    def setUp(self):
        super().setUp()
        with open(os.path.join(self.dir, "corpus.txt"), "w") as f:
            f.write(CORPUS)
        p = subprocess.run([DSWORKER, "prepare", "--input", os.path.join(self.dir, "corpus.txt"),
                            "--out", os.path.join(self.dir, "data"), "--vocab", "300"],
                           capture_output=True, timeout=120)
        self.assertEqual(p.returncode, 0, p.stderr.decode())

    def config(self, micro, stage, steps=4, checkpoint=None, batch=None, zero=None,
               accumulation=1, extra=None):
        cfg = {
            "gradient_accumulation_steps": accumulation,
            "optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "weight_decay": 0.1}},
            "gradient_clipping": 1.0,
            "steps_per_print": 1,
            "zero_optimization": {"stage": stage},
            "model": {"n_layer": 2, "n_head": 2, "n_embd": 32, "seq_len": 16, "vocab_size": 300},
            "data": {"train": os.path.join(self.dir, "data", "train_000.bin"), "shuffle": False},
            "train": {"steps": steps, "seed": 7},
        }
        if batch:
            cfg["train_batch_size"] = batch
        else:
            cfg["train_micro_batch_size_per_gpu"] = micro
        if checkpoint:
            cfg["checkpoint"] = checkpoint
        cfg["zero_optimization"].update(zero or {})
        cfg.update(extra or {})
        path = os.path.join(self.dir, "ds-%d-%d-%d.json" % (micro, stage, len(os.listdir(self.dir))))
        with open(path, "w") as f:
            json.dump(cfg, f)
        return path

    def train(self, nodes, micro, stage, launcher_args=(), **kw):
        logs = os.path.join(self.dir, "logs-%d" % len(os.listdir(self.dir)))
        p = self.run_job(self.args(nodes=nodes, slots=1) + list(launcher_args) +
                         ["--log_dir", logs, DSWORKER, "train",
                                                             "--config",
                                                             self.config(micro, stage, **kw)],
                         timeout=300, OMP_NUM_THREADS="1")
        self.assertEqual(p.returncode, 0, p.stderr.decode()[-3000:])
        self.stdout = p.stdout.decode()
        with open(os.path.join(logs, "metrics.jsonl")) as f:
            return [json.loads(l) for l in f]



class BlasKernels(unittest.TestCase):
    """OpenBLAS falls back to SSE3 kernels ("Prescott") on CPUs newer than it
    knows; dsworker restarts itself with the kernels the CPU can run, unless
    the user named some."""

    def core(self, **env):
        e = {k: v for k, v in os.environ.items() if k != "OPENBLAS_CORETYPE"}
        e.update(env)
        out = subprocess.run([DSWORKER, "version"], capture_output=True, env=e, timeout=30,
                             check=True).stdout.decode()
        m = re.search(r"OpenBLAS core (\S+),", out)
        self.assertIsNotNone(m, out)
        return m.group(1)

    def test_vector_kernels_are_used_where_the_cpu_has_them(self):
        with open("/proc/cpuinfo") as f:
            flags = set(next(l for l in f if l.startswith("flags")).split())
        if not {"avx2", "fma"} <= flags:
            self.skipTest("no AVX2 and FMA on this CPU")
        self.assertNotEqual(self.core(), "Prescott")

    def test_a_core_the_user_names_is_kept(self):
        self.assertEqual(self.core(OPENBLAS_CORETYPE="Prescott"), "Prescott")
        self.assertEqual(self.core(OPENBLAS_CORETYPE="Sandybridge"), "Sandybridge")


class Training(WorkerTest):
    def test_every_stage_gives_the_same_losses_at_1_2_3_and_4_ranks(self):
        reference = [r["loss"] for r in self.train(1, 0, 0, batch=12)]
        self.assertEqual(len(reference), 4)
        self.assertLess(reference[-1], reference[0])
        for stage in (0, 1, 2, 3):
            for world in (1, 2, 3, 4):
                if world == 1 and stage == 0:
                    continue
                with self.subTest(stage=stage, world=world):
                    records = self.train(world, 0, stage, batch=12)
                    for rank in range(world):
                        losses = [r["loss"] for r in records if r["rank"] == rank]
                        self.assertEqual(len(losses), 4)
                        for a, b in zip(losses, reference):
                            self.assertAlmostEqual(a, b, delta=1e-5 * abs(b))

    def test_gradient_buckets_of_any_size_give_the_same_losses(self):
        # 2 blocks of 12704 parameters and the final LayerNorm (64), each
        # padded to 16 floats per rank: a bucket of 1 element holds one
        # layer, 13000 holds the LayerNorm with block 1, the default all.
        # The sums are the same whatever the bucketing: losses agree exactly.
        reference = [r["loss"] for r in self.train(1, 0, 0, batch=12)]
        for stage in (2, 3):
            for accumulation in (1, 2):
                first = None
                for size, buckets in ((1, 3), (13000, 2), (500000000, 1)):
                    with self.subTest(stage=stage, accumulation=accumulation,
                                      reduce_bucket_size=size):
                        records = self.train(3, 0, stage, batch=12, accumulation=accumulation,
                                             zero={"reduce_bucket_size": size})
                        self.assertIn("ZeRO stage %d on 3 ranks (%d gradient bucket%s), "
                                      "batch 12 = %d micro x %d accumulation"
                                      % (stage, buckets, "" if buckets == 1 else "s",
                                         4 // accumulation, accumulation), self.stdout)
                        losses = [[r["loss"] for r in records if r["rank"] == rank]
                                  for rank in range(3)]
                        for rank in range(3):
                            self.assertEqual(losses[rank], losses[0])
                        self.assertEqual(len(losses[0]), 4)
                        for a, b in zip(losses[0], reference):
                            self.assertAlmostEqual(a, b, delta=1e-5 * abs(b))
                        first = first or losses[0]
                        self.assertEqual(losses[0], first)

    def test_model_state_bytes_follow_the_stage_formulas(self):
        n = 3
        size = {s: self.train(n, 4, s)[0]["model_state_bytes"] for s in (0, 1, 2, 3)}
        psi = size[0] / 16  # stage 0: params, grads, m, v in fp32 = 16 bytes/param
        slack = 64 * 16 * 4  # per-layer padding to whole 16-float pieces
        self.assertAlmostEqual(size[1], 8 * psi + 8 * psi / n, delta=slack)
        self.assertAlmostEqual(size[2], 4 * psi + 12 * psi / n, delta=slack)
        self.assertAlmostEqual(size[3], 16 * psi / n, delta=slack)


class Devices(WorkerTest):
    """dsworker on machines without a GPU: the CPU binary needs no CUDA
    library, --device auto trains on the CPU, --device cuda says why not;
    its stdout goes out line by line into a pipe (under dslaunch the
    header reaches the console when it is written, not at the exit)."""

    def test_the_cpu_binary_loads_no_cuda_library(self):
        p = subprocess.run(["ldd", DSWORKER], capture_output=True, timeout=30)
        self.assertEqual(p.returncode, 0, p.stderr.decode())
        for lib in ("libcuda", "libcudart", "libcublas", "libnccl", "libdsl_cuda"):
            self.assertNotIn(lib, p.stdout.decode())

    def test_cuda_without_a_gpu_says_why_and_auto_uses_the_cpu(self):
        env = dict(os.environ, CUDA_VISIBLE_DEVICES="")  # no GPU, whatever the machine
        cfg = self.config(2, 0, steps=2)
        p = subprocess.run([DSWORKER, "train", "--config", cfg, "--device", "cuda"],
                           capture_output=True, timeout=120, env=env)
        self.assertEqual(p.returncode, 69, p.stderr.decode())
        self.assertRegex(p.stderr.decode(), r"--device cuda: (no CUDA GPU is visible|"
                                            r"this dsworker was built without CUDA|"
                                            r"cannot open the CUDA engine)")
        p = subprocess.run([DSWORKER, "train", "--config", cfg, "--device", "auto"],
                           capture_output=True, timeout=120, env=env)
        self.assertEqual(p.returncode, 0, p.stderr.decode())
        self.assertIn("train: ", p.stdout.decode())
        self.assertNotIn("GPU", p.stdout.decode())
        # A libdsl_cuda.so of another build (here one without the engine
        # interface's version at all) is refused, naming it.
        stranger = next((p for p in ("/usr/lib/x86_64-linux-gnu/libz.so.1",
                                     "/lib/x86_64-linux-gnu/libz.so.1")
                         if os.path.exists(p)), None)
        if stranger:
            p = subprocess.run([DSWORKER, "train", "--config", cfg, "--device", "cuda"],
                               capture_output=True, timeout=120,
                               env=dict(env, DSL_CUDA_LIBRARY=stranger))
            self.assertEqual(p.returncode, 69, p.stderr.decode())
            self.assertIn(stranger + " is from another build of dslaunch (engine "
                          "interface 1, this dsworker's is", p.stderr.decode())
        p = subprocess.run([DSWORKER, "train", "--config", cfg, "--device", "tpu"],
                           capture_output=True, timeout=60)
        self.assertEqual(p.returncode, 64, p.stderr.decode())
        self.assertIn('--device: "tpu" is not one of auto, cpu, cuda', p.stderr.decode())

    def test_stdout_is_written_line_by_line_into_a_pipe(self):
        # No step line (each is flushed) for a long time: only the header.
        cfg = self.config(2, 0, steps=100000, extra={"steps_per_print": 100000})
        p = subprocess.Popen([DSWORKER, "train", "--config", cfg, "--device", "cpu"],
                             stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
        try:
            ready, _, _ = select.select([p.stdout], [], [], 10)
            self.assertTrue(ready, "no line within 10 s: held in a buffer")
            first = p.stdout.readline().decode()
            self.assertTrue(first.startswith("train: "), first)
            self.assertIsNone(p.poll(), "the line came only at the exit")
        finally:
            p.kill()
            p.communicate()


class PeerDeath(WorkerTest):
    def worker_pids(self):
        """{RANK: pid} of this test's dsworker processes (found by OUT_DIR in
        their environment, which the launcher passes on)."""
        marker = ("OUT_DIR=%s" % self.out).encode()
        found = {}
        for pid in filter(str.isdigit, os.listdir("/proc")):
            try:
                with open("/proc/%s/cmdline" % pid, "rb") as f:
                    if os.path.basename(f.read().split(b"\0")[0]) != b"dsworker":
                        continue
                with open("/proc/%s/environ" % pid, "rb") as f:
                    env = f.read().split(b"\0")
            except OSError:
                continue
            if marker in env and self.alive(int(pid)):
                rank = [e for e in env if e.startswith(b"RANK=")]
                found[int(rank[0][5:])] = int(pid)
        return found

    @staticmethod
    def ranks_reporting(metrics):
        """Ranks with a progress record in metrics.jsonl (whole lines only)."""
        try:
            with open(metrics) as f:
                text = f.read()
        except FileNotFoundError:
            return set()
        return {json.loads(line)["rank"] for line in text.split("\n")[:-1] if line}

    def test_a_killed_rank_stops_its_peers_inside_their_collectives(self):
        logs = os.path.join(self.dir, "logs")
        stderr = open(os.path.join(self.dir, "stderr"), "w+b")
        self.addCleanup(stderr.close)
        job = subprocess.Popen(self.args(nodes=3, slots=1) + [
            "--log_dir", logs, DSWORKER, "train", "--config",
            self.config(4, 2, steps=100000)], stdout=subprocess.DEVNULL, stderr=stderr,
            env=self.env(OMP_NUM_THREADS="1"))
        self.addCleanup(lambda: job.poll() is None and job.kill())
        metrics = os.path.join(logs, "metrics.jsonl")
        # Kill only once every rank is training (has reported a step), so its
        # peers are inside their collectives.
        deadline = time.monotonic() + 60
        while self.ranks_reporting(metrics) != {0, 1, 2}:
            self.assertIsNone(job.poll(), "the job ended before the kill")
            self.assertLess(time.monotonic(), deadline, "training did not start on every rank")
            time.sleep(0.05)
        pids = self.worker_pids()
        self.assertEqual(sorted(pids), [0, 1, 2])
        os.kill(pids[1], signal.SIGKILL)
        killed = time.monotonic()
        job.wait(timeout=30)
        elapsed = time.monotonic() - killed
        stderr.seek(0)
        err = stderr.read().decode()
        self.assertEqual(job.returncode, 137, err[-2000:])
        self.assertIn("FAILED: rank 1", err)
        self.assertIn("was killed by SIGKILL", err)
        self.assertLess(elapsed, 5, err[-2000:])  # not a collective's timeout
        self.assertEqual(self.worker_pids(), {})


    def test_sigterm_to_one_rank_stops_every_rank_after_the_same_step(self):
        # Only rank 2 gets SIGTERM; the step's all-reduce tells the others,
        # all three save that one step together and exit 143.
        ck = os.path.join(self.dir, "ck")
        logs = os.path.join(self.dir, "logs")
        job = subprocess.Popen(self.args(nodes=3, slots=1) + [
            "--log_dir", logs, DSWORKER, "train", "--config",
            self.config(4, 2, steps=100000, checkpoint={"dir": ck})],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=self.env(OMP_NUM_THREADS="1"))
        self.addCleanup(lambda: job.poll() is None and job.kill())
        metrics = os.path.join(logs, "metrics.jsonl")
        deadline = time.monotonic() + 60
        while self.ranks_reporting(metrics) != {0, 1, 2}:
            self.assertIsNone(job.poll(), "the job ended before the SIGTERM")
            self.assertLess(time.monotonic(), deadline, "training did not start on every rank")
            time.sleep(0.05)
        pids = self.worker_pids()
        os.kill(pids[2], signal.SIGTERM)
        out, err = job.communicate(timeout=60)
        out, err = out.decode(), err.decode()
        self.assertEqual(job.returncode, 143, err[-3000:])
        # Rank 0 got no signal itself; it learnt of rank 2's in the step.
        m = re.search(r"stopping after step (\d+) \(SIGTERM\); checkpoint saved", out)
        self.assertIsNotNone(m, out[-2000:])
        saved = os.path.join(ck, "step_%08d" % int(m.group(1)))
        self.assertTrue(os.path.exists(os.path.join(saved, "COMPLETE")), os.listdir(ck))
        self.assertEqual(sorted(os.listdir(ck)), [os.path.basename(saved)])
        # Every rank ended on its own, 143, none killed by the launcher.
        for rank in range(3):
            self.assertRegex(err, r"rank %d .*(exit 143|exited with code 143)" % rank)
        self.assertEqual(self.worker_pids(), {})


class AgainstPyTorch(WorkerTest):
    def test_adamw_steps_match_pytorch_from_the_same_model_file(self):
        if subprocess.run(["/usr/bin/python3", "-c", "import torch"],
                          capture_output=True).returncode != 0:
            if os.environ.get("CI"):
                self.fail("python3-torch is missing")
            self.skipTest("Debian's python3-torch is not installed")
        ck = os.path.join(self.dir, "ck")
        self.train(1, 4, 0, steps=1, checkpoint={"dir": ck, "every": 1})
        model = os.path.join(self.dir, "init.bin")
        p = self.run_job([DSWORKER, "export", "--checkpoint", os.path.join(ck, "step_00000001"),
                          "--out", model])
        self.assertEqual(p.returncode, 0, p.stderr.decode())
        with open(self.config(4, 0, steps=5)) as f:
            cfg = json.load(f)
        cfg["optimizer"] = {"type": "AdamW", "params": {"lr": 1e-3, "betas": [0.9, 0.999],
                                                         "eps": 1e-8, "weight_decay": 0.1}}
        cfg["gradient_clipping"] = 0
        path = os.path.join(self.dir, "adamw.json")
        with open(path, "w") as f:
            json.dump(cfg, f)
        p = self.run_job([DSWORKER, "train", "--config", path, "--init", model], timeout=300)
        self.assertEqual(p.returncode, 0, p.stderr.decode())
        ours = [float(m) for m in re.findall(r"loss ([0-9.]+)", p.stdout.decode())]
        script = os.path.join(os.path.dirname(os.path.abspath(__file__)),
                              "../worker/torch_adamw_steps.py")
        t = subprocess.run(["/usr/bin/python3", script, model,
                            os.path.join(self.dir, "data", "train_000.bin"), "4", "16", "5",
                            "1e-3", "0.1"], capture_output=True, timeout=300)
        self.assertEqual(t.returncode, 0, t.stderr.decode())
        theirs = [float(x) for x in t.stdout.split()]
        self.assertEqual(len(ours), 5)
        self.assertEqual(len(theirs), 5)
        for a, b in zip(ours, theirs):
            self.assertAlmostEqual(a, b, delta=1e-4 * b)


class Checkpoints(WorkerTest):
    def losses(self, records, rank=0):
        return {r["step"]: r["loss"] for r in records if r["rank"] == rank}

    def test_resume_is_bit_exact(self):
        for stage in (1, 3):
            with self.subTest(stage=stage):
                ck = os.path.join(self.dir, "ck%d" % stage)
                whole = self.losses(self.train(2, 4, stage, steps=6))
                self.train(2, 4, stage, steps=3, checkpoint={"dir": ck, "every": 3})
                resumed = self.losses(self.train(2, 4, stage, steps=6,
                                                 checkpoint={"dir": ck, "resume": "latest"}))
                self.assertEqual(sorted(resumed), [4, 5, 6])
                for step in (4, 5, 6):
                    self.assertEqual(resumed[step], whole[step], "step %d" % step)  # every bit

    def test_sigterm_saves_a_checkpoint_that_a_restarted_run_resumes_from(self):
        # Preemption: SIGTERM to the launcher reaches every rank; they agree
        # on the step to stop after, save it, and exit 143. The next run
        # (checkpoint.resume "latest", as a requeued job has it) resumes from
        # that checkpoint, and its losses equal an uninterrupted run's.
        # (A restarted generation resumes without being told:
        # test_restarts.py.)
        ck = os.path.join(self.dir, "ck")
        logs = os.path.join(self.dir, "logs-stopped")
        stderr = open(os.path.join(self.dir, "stderr"), "w+b")
        self.addCleanup(stderr.close)
        job = subprocess.Popen(self.args(nodes=2, slots=1) + [
            "--log_dir", logs, DSWORKER, "train", "--config",
            self.config(4, 3, steps=100000, checkpoint={"dir": ck})],
            stdout=subprocess.PIPE, stderr=stderr, env=self.env(OMP_NUM_THREADS="1"))
        self.addCleanup(lambda: job.poll() is None and job.kill())
        metrics = os.path.join(logs, "metrics.jsonl")
        deadline = time.monotonic() + 60
        while self.steps_reported(metrics) < 3:
            self.assertIsNone(job.poll(), "the job ended before the SIGTERM")
            self.assertLess(time.monotonic() - deadline, 0, "training did not start")
            time.sleep(0.05)
        job.send_signal(signal.SIGTERM)
        out, _ = job.communicate(timeout=60)
        stderr.seek(0)
        err = stderr.read().decode()
        out = out.decode()
        self.assertEqual(job.returncode, 143, err[-3000:])
        m = re.search(r"stopping after step (\d+) \(SIGTERM\); checkpoint saved", out)
        self.assertIsNotNone(m, out[-3000:] + err[-3000:])
        stopped = int(m.group(1))
        saved = os.path.join(ck, "step_%08d" % stopped)
        self.assertTrue(os.path.exists(os.path.join(saved, "COMPLETE")), os.listdir(ck))
        # Every rank stopped after that step: none went on past it.
        with open(metrics) as f:
            steps = [json.loads(l)["step"] for l in f]
        self.assertLessEqual(max(steps), stopped)

        whole = self.losses(self.train(2, 4, 3, steps=stopped + 3))
        resumed = self.losses(self.train(
            2, 4, 3, steps=stopped + 3, checkpoint={"dir": ck, "resume": "latest"}))
        self.assertIn("resumed from %s at step %d" % (saved, stopped), self.stdout)
        self.assertEqual(sorted(resumed), [stopped + 1, stopped + 2, stopped + 3])
        for step in sorted(resumed):
            self.assertEqual(resumed[step], whole[step], "step %d" % step)  # every bit

    def test_resume_at_another_world_size_keeps_the_global_batch(self):
        # 2 ranks x micro 4 x accumulation 3 = 24 samples per step; at 3 ranks
        # the same 24 take accumulation 2 (the micro-batch, so each rank's
        # memory, stays), and training goes on as a run started at 3 ranks
        # with that batch from the same checkpoint does.
        ck = os.path.join(self.dir, "ck")
        self.train(2, 4, 1, steps=3, accumulation=3, checkpoint={"dir": ck, "every": 3})
        resumed = self.losses(self.train(3, 4, 1, steps=5, accumulation=3,
                                         checkpoint={"dir": ck, "resume": "latest"}))
        self.assertIn("keeping the checkpoint's global batch 24 at world size 3: "
                      "gradient_accumulation_steps 2 (was 3)", self.stdout)
        self.assertIn("batch 24 = 4 micro x 2 accumulation x 3 ranks", self.stdout)
        pinned = self.losses(self.train(
            3, 4, 1, steps=5, batch=24, accumulation=2,
            extra={"train_micro_batch_size_per_gpu": 4},
            checkpoint={"dir": ck, "resume": "latest"}))
        self.assertEqual(sorted(resumed), [4, 5])
        self.assertEqual(resumed, pinned)  # every bit
        # 24 over 5 ranks of micro-batch 4: no whole accumulation count.
        logs = os.path.join(self.dir, "logs-5")
        p = self.run_job(self.args(nodes=5, slots=1) + [
            "--log_dir", logs, DSWORKER, "train", "--config",
            self.config(4, 1, steps=5, checkpoint={"dir": ck, "resume": "latest"})],
            timeout=300, OMP_NUM_THREADS="1")
        err = p.stderr.decode()
        self.assertEqual(p.returncode, 65, err[-3000:])
        self.assertIn("the checkpoint's global batch 24 is not divisible by "
                      "train_micro_batch_size_per_gpu 4 * world_size 5", err)

    def steps_reported(self, metrics):
        try:
            with open(metrics) as f:
                return max((json.loads(l).get("step", 0) for l in f if l.endswith("\n")),
                           default=0)
        except FileNotFoundError:
            return 0

    def test_resume_at_another_world_size_reshards(self):
        ck = os.path.join(self.dir, "ck")
        whole = self.losses(self.train(2, 0, 2, steps=6, batch=12))
        self.train(2, 0, 2, steps=3, batch=12, checkpoint={"dir": ck, "every": 3})
        resumed = self.losses(self.train(3, 0, 3, steps=6, batch=12,
                                         checkpoint={"dir": ck, "resume": "latest"}))
        for step in (4, 5, 6):
            self.assertAlmostEqual(resumed[step], whole[step], delta=1e-5 * whole[step])

    def test_incomplete_checkpoint_is_never_taken_and_keep_prunes(self):
        ck = os.path.join(self.dir, "ck")
        self.train(1, 4, 0, steps=6, checkpoint={"dir": ck, "every": 2, "keep": 2})
        self.assertEqual(sorted(os.listdir(ck)), ["step_00000004", "step_00000006"])
        os.unlink(os.path.join(ck, "step_00000006", "COMPLETE"))  # as if cut mid-write
        p = self.run_job([DSWORKER, "train", "--config",
                          self.config(4, 0, steps=5, checkpoint={"dir": ck, "resume": "latest"})],
                         timeout=300)
        self.assertEqual(p.returncode, 0, p.stderr.decode())
        self.assertIn("resumed from %s/step_00000004 at step 4" % ck, p.stdout.decode())
        out = os.path.join(self.dir, "model.bin")
        p = self.run_job([DSWORKER, "export", "--checkpoint", os.path.join(ck, "step_00000006"),
                          "--out", out])
        self.assertEqual(p.returncode, 65)
        self.assertIn("incomplete", p.stderr.decode())
        p = self.run_job([DSWORKER, "export", "--checkpoint", os.path.join(ck, "step_00000004"),
                          "--out", out])
        self.assertEqual(p.returncode, 0, p.stderr.decode())
        p = self.run_job([DSWORKER, "eval", "--model", out, "--data",
                          os.path.join(self.dir, "data", "val_000.bin"), "--batch", "2",
                          "--seq", "16"])
        self.assertEqual(p.returncode, 0, p.stderr.decode())
        self.assertGreater(json.loads(p.stdout)["loss"], 0)


if __name__ == "__main__":
    unittest.main()
