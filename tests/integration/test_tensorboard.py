"""TensorBoard event files, read back with TensorBoard's own loader (its
EventAccumulator, from the PyPI package in deploy/setup.sh --test's venv):
dslaunch --tensorboard DIR writes a run per rank and a job-wide run, and
dsworker writes DeepSpeed's `tensorboard` scalars from rank 0. A directory
that cannot be made is a clear error before anything starts."""
import json
import os
import struct
import subprocess
import sys
import unittest

from harness import DSLAUNCH, PY, RANK_PY, LaunchTest
from test_worker import DSWORKER, WorkerTest

TB_VENV = os.environ.get("DSL_TENSORBOARD_VENV", "/opt/dslaunch-test/tensorboard-venv")
TB_PY = os.path.join(TB_VENV, "bin", "python")

# Run by the venv's python: every scalar of every run named on the command
# line, as {run: {tag: [[step, value], ...]}}.
READER = r"""
import json, sys
from tensorboard.backend.event_processing import event_accumulator as ea
out = {}
for run in sys.argv[1:]:
    acc = ea.EventAccumulator(run, size_guidance={ea.SCALARS: 0})
    acc.Reload()
    out[run] = {tag: [[e.step, e.value] for e in acc.Scalars(tag)]
                for tag in acc.Tags()["scalars"]}
print(json.dumps(out))
"""

# A rank that reports STEPS progress records with values of its own, and one
# record without a step (which TensorBoard must not get).
RANK_SCRIPT = r"""
import json, os, socket, sys, time
rank = int(os.environ["RANK"])
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
s.connect(os.environ["DSLAUNCH_PROGRESS"])
s.sendall(b'{"loss": 99.0, "note": "no step"}\n')
for step in range(1, int(sys.argv[1]) + 1):
    rec = {"step": step, "loss": 1.0 / (rank + step) + 0.1 * rank,
           "tokens_per_s": 1000.0 * (rank + 1) + step, "lr": 1e-4 * step}
    s.sendall((json.dumps(rec) + "\n").encode())
    time.sleep(0.02)
s.close()
"""


def f32(x):
    """`x` as TensorBoard stores it (simple_value is a float)."""
    return struct.unpack("f", struct.pack("f", x))[0]


def rank_values(rank, step):
    return {"loss": 1.0 / (rank + step) + 0.1 * rank,
            "tokens_per_s": 1000.0 * (rank + 1) + step, "lr": 1e-4 * step}


def need_tensorboard(test):
    """Skips `test` without the TensorBoard venv (fails it under CI=1)."""
    if os.access(TB_PY, os.X_OK):
        return
    msg = "TensorBoard's venv %s is missing (deploy/setup.sh --test)" % TB_VENV
    if os.environ.get("CI"):
        test.fail(msg)
    test.skipTest(msg)


def read_runs(test, *runs):
    """{run: {tag: [[step, value], ...]}} by TensorBoard's EventAccumulator."""
    for run in runs:
        test.assertTrue(os.path.isdir(run), "no run directory " + run)
    p = subprocess.run([TB_PY, "-c", READER, *runs], capture_output=True, timeout=120)
    test.assertEqual(p.returncode, 0, p.stderr.decode()[-3000:])
    return json.loads(p.stdout)


class LauncherRuns(LaunchTest):
    STEPS = 6

    def setUp(self):
        super().setUp()
        need_tensorboard(self)
        self.script = os.path.join(self.dir, "tb_rank.py")
        with open(self.script, "w") as f:
            f.write(RANK_SCRIPT)

    def launch(self, tb_dir, *program):
        return self.run_job([DSLAUNCH, "--launcher", "local", "--num_gpus", "3",
                             "--no_local_rank", "--tensorboard", tb_dir, "--no_python", *program],
                            timeout=120, ENV_KEYS="[]")

    def test_rank_runs_hold_what_each_rank_sent_and_the_job_run_aggregates(self):
        tb = os.path.join(self.dir, "tb")
        p = self.launch(tb, PY, self.script, str(self.STEPS))
        self.assertEqual(p.returncode, 0, p.stderr.decode()[-3000:])
        self.assertEqual(sorted(os.listdir(tb)), ["job", "rank-0", "rank-1", "rank-2"])
        runs = read_runs(self, *(os.path.join(tb, r) for r in sorted(os.listdir(tb))))
        steps = list(range(1, self.STEPS + 1))
        for rank in range(3):
            run = runs[os.path.join(tb, "rank-%d" % rank)]
            self.assertEqual(sorted(run), ["loss", "lr", "tokens_per_s"])
            for tag, points in run.items():
                self.assertEqual([s for s, _ in points], steps, tag)
                for step, value in points:
                    self.assertEqual(value, f32(rank_values(rank, step)[tag]), (rank, tag, step))
        job = runs[os.path.join(tb, "job")]
        self.assertEqual(sorted(job), ["loss", "lr", "tokens_per_s"])
        for tag, points in job.items():
            self.assertEqual([s for s, _ in points], steps, tag)
            for step, value in points:
                values = [rank_values(r, step)[tag] for r in range(3)]
                want = sum(values) if tag == "tokens_per_s" else sum(values) / 3
                self.assertAlmostEqual(value, f32(want), delta=abs(want) * 1e-6,
                                       msg=(tag, step))

    def test_a_directory_that_cannot_be_made_is_refused_before_any_rank_starts(self):
        bad = "/dev/null/tb"
        p = self.launch(bad, PY, RANK_PY, "env")
        err = p.stderr.decode(errors="replace")
        self.assertNotEqual(p.returncode, 0, err)
        self.assertIn("--tensorboard " + bad, err)
        self.assertNotIn("Traceback", err)
        self.assertEqual([n for n in os.listdir(self.out) if n.startswith("start-")], [])


class WorkerRuns(WorkerTest):
    def setUp(self):
        need_tensorboard(self)
        super().setUp()

    def write_config(self, tensorboard, steps=4, batch=4):
        cfg = {
            "train_batch_size": batch,
            "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}},
            "scheduler": {"type": "WarmupLR",
                          "params": {"warmup_num_steps": 3, "warmup_type": "linear"}},
            "steps_per_print": 1,
            "model": {"n_layer": 2, "n_head": 2, "n_embd": 32, "seq_len": 16, "vocab_size": 300},
            "data": {"train": os.path.join(self.dir, "data", "train_000.bin"), "shuffle": False},
            "train": {"steps": steps, "seed": 7},
            "tensorboard": tensorboard,
        }
        path = os.path.join(self.dir, "ds-tb.json")
        with open(path, "w") as f:
            json.dump(cfg, f)
        return path

    def test_rank_zero_writes_deepspeeds_tags_at_global_sample_counts(self):
        out = os.path.join(self.dir, "tbout")
        config = self.write_config({"enabled": True, "output_path": out, "job_name": "gpt"})
        logs = os.path.join(self.dir, "logs")
        p = self.run_job(self.args(nodes=2, slots=1) + ["--log_dir", logs, DSWORKER, "train",
                                                        "--config", config],
                         timeout=300, OMP_NUM_THREADS="1")
        self.assertEqual(p.returncode, 0, p.stderr.decode()[-3000:])
        self.assertEqual(os.listdir(out), ["gpt"])
        files = os.listdir(os.path.join(out, "gpt"))
        self.assertEqual(len(files), 1, files)  # rank 0 only
        self.assertTrue(files[0].startswith("events.out.tfevents."), files)
        with open(os.path.join(logs, "metrics.jsonl")) as f:
            records = [json.loads(l) for l in f if json.loads(l).get("rank") == 0]
        self.assertEqual([r["step"] for r in records], [1, 2, 3, 4])
        run = read_runs(self, os.path.join(out, "gpt"))[os.path.join(out, "gpt")]
        self.assertEqual(sorted(run), ["Train/Samples/lr", "Train/Samples/train_loss"])
        # DeepSpeed: the loss of step k at the samples seen before it ...
        self.assertEqual(run["Train/Samples/train_loss"],
                         [[4 * (r["step"] - 1), f32(r["loss"])] for r in records])
        # ... and the rate its scheduler set for step k+1 at those after it
        # (WarmupLR, linear over 3 steps: lr * min(1, (k) / 3)).
        self.assertEqual([s for s, _ in run["Train/Samples/lr"]], [4, 8, 12, 16])
        for (step, value), want in zip(run["Train/Samples/lr"],
                                       [1e-3 / 3, 2e-3 / 3, 1e-3, 1e-3]):
            self.assertAlmostEqual(value, f32(want), delta=want * 1e-6, msg=step)

    def test_an_output_path_that_cannot_be_made_names_the_key(self):
        config = self.write_config({"enabled": True, "output_path": "/dev/null/tb"}, steps=1)
        p = subprocess.run([DSWORKER, "train", "--config", config], capture_output=True,
                           timeout=120, env=self.env(OMP_NUM_THREADS="1"))
        err = p.stderr.decode(errors="replace")
        self.assertNotEqual(p.returncode, 0, err)
        self.assertIn("tensorboard.output_path /dev/null/tb/DeepSpeedJobName", err)


if __name__ == "__main__":
    unittest.main()
