"""A Hugging Face Trainer script, unchanged by dslaunch: a tiny Llama made
from a config (nothing downloaded) learns a fixed token pattern for STEPS
steps on CPU under DDP (Gloo), logging every step. It writes what the Trainer
logged to OUT_DIR/hf-<rank>.json (the script's own record, to compare with
what dslaunch reported), then waits for OUT_DIR/release (at most 60 s) so that
a test can scrape the live metrics before the job ends."""
import json
import os
import time

import torch
from transformers import (LlamaConfig, LlamaForCausalLM, Trainer, TrainerCallback,
                          TrainingArguments)

STEPS = int(os.environ.get("STEPS", "8"))
OUT = os.environ["OUT_DIR"]
RANK = int(os.environ.get("RANK", "0"))


class Tokens(torch.utils.data.Dataset):
    def __len__(self):
        return 256

    def __getitem__(self, i):
        ids = torch.tensor([(i + j * 3) % 61 for j in range(32)])
        return {"input_ids": ids, "labels": ids}


class Record(TrainerCallback):
    def __init__(self):
        self.logs = []

    def on_log(self, args, state, control, logs=None, **kwargs):
        if logs and "loss" in logs:
            self.logs.append({"step": state.global_step, "loss": logs["loss"],
                              "lr": logs.get("learning_rate")})


torch.manual_seed(0)
model = LlamaForCausalLM(LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64,
                                     num_hidden_layers=2, num_attention_heads=2,
                                     max_position_embeddings=32))
args = TrainingArguments(output_dir=os.path.join(OUT, "trainer-%d" % RANK), max_steps=STEPS,
                         per_device_train_batch_size=4, learning_rate=1e-3, logging_steps=1,
                         save_strategy="no", report_to=[], use_cpu=True, ddp_backend="gloo",
                         disable_tqdm=True, seed=0, dataloader_num_workers=0)
record = Record()
trainer = Trainer(model=model, args=args, train_dataset=Tokens(), callbacks=[record])
trainer.train()
for r in record.logs:
    print("trainer step %d loss %.6f" % (r["step"], r["loss"]), flush=True)
with open(os.path.join(OUT, "hf-%d.json" % RANK), "w") as f:
    json.dump(record.logs, f)
deadline = time.monotonic() + 60
while not os.path.exists(os.path.join(OUT, "release")) and time.monotonic() < deadline:
    time.sleep(0.1)
