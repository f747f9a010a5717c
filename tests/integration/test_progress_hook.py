"""dslaunch's progress hook (python/dslaunch_hook, python/dslaunch/_hook.py):
a Python rank that imports DeepSpeed reports its steps with no change to the
script. An engine of the test's own (a fake deepspeed package: quick, every
field checked), then the real DeepSpeed 0.14 from the test venv, whose
records must equal the losses the script computes itself; --no_progress_hook
turns it off; a sitecustomize of the user's still runs; a hook that cannot
attach says so once and the script runs on."""
import json
import os
import sys
import unittest

from harness import LaunchTest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "cluster"))
import deepspeed_env  # noqa: E402

FAKE_ENGINE = '''
class DeepSpeedEngine:
    def __init__(self, gas):
        self.gas, self.calls, self.global_steps, self.skipped_steps = gas, 0, 0, 0
    def train_micro_batch_size_per_gpu(self):
        return 4
    def gradient_accumulation_steps(self):
        return self.gas
    def get_lr(self):
        return [0.001 * (self.global_steps + 1)]
    def backward(self, loss):
        return loss
    def step(self):
        self.calls += 1
        if self.calls % self.gas == 0:
            self.global_steps += 1
            if self.global_steps == 2:
                self.skipped_steps += 1
'''

SCRIPT = '''
import os, time
from deepspeed.runtime.engine import DeepSpeedEngine
class Loss(float):
    def detach(self):
        return self
e = DeepSpeedEngine(gas=2)
for i in range(6):
    e.backward(Loss(float(i)))
    e.step()
    time.sleep(0.01)
print("done", flush=True)
'''


FAKE_TRAINER = '''
class _State:
    global_step = 0

class Trainer:
    def __init__(self, steps):
        self.steps, self.callbacks, self.state = steps, [], _State()
    def add_callback(self, callback):
        self.callbacks.append(callback)
    def train(self):
        for i in range(self.steps):
            self.state.global_step += 1
            logs = {"loss": 1.0 / self.state.global_step, "learning_rate": 0.5,
                    "epoch": 0.25 * self.state.global_step, "note": "text"}
            for c in self.callbacks:
                c.on_log(None, self.state, None, logs=logs)
        # What train() logs at its end: a summary, no step of its own.
        for c in self.callbacks:
            c.on_log(None, self.state, None, logs={"train_runtime": 1.5, "train_loss": 0.6})
'''

FAKE_CALLBACK = '''
class TrainerCallback:
    def on_log(self, args, state, control, logs=None, **kwargs):
        pass
'''


class ProgressHook(LaunchTest):
    def setUp(self):
        super().setUp()
        self.fake = os.path.join(self.dir, "fake")
        os.makedirs(os.path.join(self.fake, "deepspeed", "runtime"))
        for d in ("deepspeed", "deepspeed/runtime"):
            open(os.path.join(self.fake, d, "__init__.py"), "w").close()
        with open(os.path.join(self.fake, "deepspeed", "runtime", "engine.py"), "w") as f:
            f.write(FAKE_ENGINE)
        self.script = os.path.join(self.dir, "train.py")
        with open(self.script, "w") as f:
            f.write(SCRIPT)

    def records(self, logs):
        with open(os.path.join(logs, "metrics.jsonl")) as f:
            return [json.loads(line) for line in f if '"step"' in line]

    def run_script(self, *extra, ranks=2, env_extra=None, script=None):
        logs = os.path.join(self.dir, "logs-%d" % len(os.listdir(self.dir)))
        p = self.run_job(self.args(nodes=1, slots=ranks, extra=extra) +
                         ["--log_dir", logs, sys.executable, script or self.script],
                         timeout=60, PYTHONPATH=self.fake, **(env_extra or {}))
        self.assertEqual(p.returncode, 0, p.stderr.decode())
        return p, logs

    def test_deepspeeds_steps_are_reported_from_an_unchanged_script(self):
        p, logs = self.run_script()
        records = self.records(logs)
        for rank in range(2):
            mine = [r for r in records if r["rank"] == rank]
            self.assertEqual([r["step"] for r in mine], [1, 2, 3], mine)
            # The mean of each step's two micro-batch losses.
            self.assertEqual([r["loss"] for r in mine], [0.5, 2.5, 4.5])
            # lr after the step (DeepSpeed's get_lr then), skipped steps.
            self.assertEqual([r["lr"] for r in mine], [0.002, 0.003, 0.004])
            self.assertEqual([r["skipped_steps"] for r in mine], [0, 1, 1])
            self.assertTrue(all(r["samples_per_s"] > 0 for r in mine), mine)
        self.assertNotIn("progress hook", p.stderr.decode())

    def test_the_hugging_face_trainers_logs_are_reported(self):
        hf = os.path.join(self.fake, "transformers")
        os.makedirs(hf)
        open(os.path.join(hf, "__init__.py"), "w").close()
        with open(os.path.join(hf, "trainer.py"), "w") as f:
            f.write(FAKE_TRAINER)
        with open(os.path.join(hf, "trainer_callback.py"), "w") as f:
            f.write(FAKE_CALLBACK)
        script = os.path.join(self.dir, "hf.py")
        with open(script, "w") as f:
            f.write("from transformers.trainer import Trainer\nTrainer(3).train()\n")
        p, logs = self.run_script(ranks=1, script=script)
        mine = self.records(logs)
        self.assertEqual([r["step"] for r in mine], [1, 2, 3], mine)
        self.assertEqual([r["loss"] for r in mine], [1.0, 0.5, 1.0 / 3])
        self.assertEqual([r["lr"] for r in mine], [0.5] * 3)
        self.assertEqual([r["epoch"] for r in mine], [0.25, 0.5, 0.75])
        self.assertTrue(all("note" not in r for r in mine))  # numbers only
        self.assertNotIn("progress hook", p.stderr.decode())

    def test_no_progress_hook_sends_nothing(self):
        _, logs = self.run_script("--no_progress_hook")
        self.assertEqual(self.records(logs), [])

    def test_a_users_sitecustomize_still_runs(self):
        mine = os.path.join(self.dir, "mine")
        os.makedirs(mine)
        marker = os.path.join(self.dir, "marker-")
        with open(os.path.join(mine, "sitecustomize.py"), "w") as f:
            f.write("import os\nopen(%r + os.environ['RANK'], 'w').close()\n" % marker)
        logs = os.path.join(self.dir, "logs-s")
        p = self.run_job(self.args(nodes=1, slots=2) +
                         ["--log_dir", logs, sys.executable, self.script],
                         timeout=60, PYTHONPATH=self.fake + ":" + mine)
        self.assertEqual(p.returncode, 0, p.stderr.decode())
        self.assertTrue(os.path.exists(marker + "0") and os.path.exists(marker + "1"))
        self.assertEqual(len(self.records(logs)), 6)

    def test_a_hook_that_cannot_attach_says_so_once_and_the_script_runs(self):
        with open(os.path.join(self.fake, "deepspeed", "runtime", "engine.py"), "w") as f:
            f.write("VERSION = 'not the engine we know'\n")
        bad = os.path.join(self.dir, "bad.py")
        with open(bad, "w") as f:
            f.write("import deepspeed.runtime.engine as e\nprint('ran', e.VERSION)\n")
        p, logs = self.run_script(ranks=1, script=bad)
        err = p.stderr.decode()
        self.assertEqual(err.count("progress hook for deepspeed is off"), 1, err)
        self.assertIn("ran not the engine we know", p.stdout.decode())

    def test_the_real_deepspeed(self):
        deepspeed_env.need_deepspeed(self)
        out = os.path.join(self.dir, "ds")
        os.makedirs(out)
        logs = os.path.join(self.dir, "logs-ds")
        env = deepspeed_env.activated()
        p = self.run_job(self.args(nodes=1, slots=2) +
                         ["--log_dir", logs, *deepspeed_env.script_args(out)],
                         timeout=300, **env)
        self.assertEqual(p.returncode, 0, p.stderr.decode()[-3000:])
        self.assertNotIn("progress hook", p.stderr.decode())
        deepspeed_env.check_hook_records(self, out, logs, world=2)
        self.assertTrue(all(r["skipped_steps"] == 0 for r in self.records(logs)))


if __name__ == "__main__":
    unittest.main()
