"""A DeepSpeed training script as users write them (argparse with
--local_rank, deepspeed.add_config_arguments, deepspeed.initialize, the
engine's backward and step), on the CPU over Gloo: a small MLP, seeded, each
rank with its own data. It writes OUT/losses-RANK.json (its losses, world
size, the --local_rank it was given, its interpreter's prefix) and prints
its losses. Run by `deepspeed` itself and by dslaunch; the losses must
match."""
import argparse
import json
import os
import sys

import torch
import deepspeed

p = argparse.ArgumentParser()
p.add_argument("--local_rank", type=int, default=-1)
p.add_argument("--steps", type=int, default=5)
p.add_argument("--out", default=".")
p = deepspeed.add_config_arguments(p)
args = p.parse_args()
deepspeed.init_distributed(dist_backend="gloo")
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))
engine, _, _, _ = deepspeed.initialize(args=args, model=model, model_parameters=model.parameters())
rank = torch.distributed.get_rank()
g = torch.Generator().manual_seed(100 + rank)
losses = []
for step in range(args.steps):
    x = torch.randn(8, 16, generator=g)
    y = x.sum(dim=1, keepdim=True)
    loss = torch.nn.functional.mse_loss(engine(x), y)
    engine.backward(loss)
    engine.step()
    losses.append(loss.item())
with open(os.path.join(args.out, "losses-%d.json" % rank), "w") as f:
    json.dump({"losses": losses, "world": torch.distributed.get_world_size(),
               "local_rank_arg": args.local_rank, "prefix": sys.prefix,
               "virtual_env": os.environ.get("VIRTUAL_ENV")}, f)
print("rank %d losses %s" % (rank, " ".join("%.6f" % x for x in losses)), flush=True)
# As training scripts end: without it, Gloo's threads can outlive the
# interpreter's shutdown on torch 1.13 (std::terminate, SIGABRT).
torch.distributed.barrier()
torch.distributed.destroy_process_group()
