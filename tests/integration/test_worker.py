"""dsworker through dslaunch: the same training steps give the same losses at
1 and 2 ranks under ZeRO stages 0 and 1, and model_state_bytes follows the
stage's formula. A tiny model on a tiny corpus, a few seconds."""
import json
import os
import re
import subprocess
import unittest

from harness import DSLAUNCH, LaunchTest

DSWORKER = os.path.join(os.path.dirname(DSLAUNCH), "dsworker")
CORPUS = ("In the beginning God created the heaven and the earth. And the earth was "
          "without form, and void; and darkness was upon the face of the deep. ") * 300


class Training(LaunchTest):
    def setUp(self):
        super().setUp()
        with open(os.path.join(self.dir, "corpus.txt"), "w") as f:
            f.write(CORPUS)
        p = subprocess.run([DSWORKER, "prepare", "--input", os.path.join(self.dir, "corpus.txt"),
                            "--out", os.path.join(self.dir, "data"), "--vocab", "300"],
                           capture_output=True, timeout=120)
        self.assertEqual(p.returncode, 0, p.stderr.decode())

    def config(self, micro, stage):
        cfg = {
            "train_micro_batch_size_per_gpu": micro,
            "gradient_accumulation_steps": 1,
            "optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "weight_decay": 0.1}},
            "gradient_clipping": 1.0,
            "steps_per_print": 1,
            "zero_optimization": {"stage": stage},
            "model": {"n_layer": 2, "n_head": 2, "n_embd": 32, "seq_len": 16, "vocab_size": 300},
            "data": {"train": os.path.join(self.dir, "data", "train_000.bin"), "shuffle": False},
            "train": {"steps": 4, "seed": 7},
        }
        path = os.path.join(self.dir, "ds-%d-%d.json" % (micro, stage))
        with open(path, "w") as f:
            json.dump(cfg, f)
        return path

    def train(self, nodes, micro, stage):
        logs = os.path.join(self.dir, "logs-%d-%d" % (nodes, stage))
        p = self.run_job(self.args(nodes=nodes, slots=1) + ["--log_dir", logs, DSWORKER, "train",
                                                             "--config", self.config(micro, stage)],
                         timeout=300, OMP_NUM_THREADS="1")
        self.assertEqual(p.returncode, 0, p.stderr.decode()[-3000:])
        with open(os.path.join(logs, "metrics.jsonl")) as f:
            return [json.loads(l) for l in f]

    def test_losses_match_across_world_sizes_and_stages(self):
        single = [r["loss"] for r in self.train(1, 8, 0)]
        self.assertEqual(len(single), 4)
        self.assertLess(single[-1], single[0])
        for stage in (0, 1):
            records = self.train(2, 4, stage)
            for rank in (0, 1):
                losses = [r["loss"] for r in records if r["rank"] == rank]
                for a, b in zip(losses, single):
                    self.assertAlmostEqual(a, b, delta=1e-5 * abs(b))

    def test_model_state_bytes_follow_the_stage_formula(self):
        s0 = self.train(2, 4, 0)[0]["model_state_bytes"]
        s1 = self.train(2, 4, 1)[0]["model_state_bytes"]
        psi = s0 / 16  # stage 0: params, grads, m, v in fp32 = 16 bytes/param
        self.assertAlmostEqual(s1, 8 * psi + 8 * psi / 2, delta=64 * 16)


if __name__ == "__main__":
    unittest.main()
