"""N AdamW steps of GPT-2 in PyTorch (float32) from an llm.c model file, on
the first N batches of a token shard, as dsworker takes them with
shuffle=false at one rank: step k trains on tokens [k*B*T, k*B*T + B*T + 1).
Weight decay on wte, wpe and the four weight matrices per block only, as
dsworker (and llm.c) apply it. Prints one loss per line.

usage: torch_adamw_steps.py MODEL.bin SHARD.bin B T STEPS LR WD
Run with Debian's /usr/bin/python3 (PyTorch 1.13 CPU).
"""
import sys

import numpy as np
import torch

from torch_compare import forward, read_model

DECAY = {"wte", "wpe", "qkvw", "attprojw", "fcw", "fcprojw"}


def main():
    model, shard, B, T, steps, lr, wd = sys.argv[1:8]
    B, T, steps, lr, wd = int(B), int(T), int(steps), float(lr), float(wd)
    cfg, params = read_model(model)
    params = {k: v.detach().float().requires_grad_(True) for k, v in params.items()}
    header = np.fromfile(shard, dtype=np.int32, count=256)
    assert header[0] == 20240520, "not an llm.c token shard"
    tokens = torch.from_numpy(np.fromfile(shard, dtype=np.uint16, offset=1024).astype(np.int64))
    groups = [{"params": [p for k, p in params.items() if k in DECAY], "weight_decay": wd},
              {"params": [p for k, p in params.items() if k not in DECAY], "weight_decay": 0.0}]
    opt = torch.optim.AdamW(groups, lr=lr, betas=(0.9, 0.999), eps=1e-8)
    for step in range(steps):
        chunk = tokens[step * B * T: step * B * T + B * T + 1]
        x, y = chunk[:-1].view(B, T), chunk[1:].view(B, T)
        opt.zero_grad()
        loss = forward(cfg, params, x, y)
        loss.backward()
        opt.step()
        print("%.9g" % loss.item(), flush=True)


if __name__ == "__main__":
    torch.manual_seed(0)
    torch.set_num_threads(1)
    main()
