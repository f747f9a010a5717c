"""An ordinary PyTorch DDP script, as a user would write it for torchrun or
the DeepSpeed launcher: env:// rendezvous, gloo backend, --local_rank accepted."""
import argparse

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

parser = argparse.ArgumentParser()
parser.add_argument("--local_rank", type=int, default=0)
args = parser.parse_args()

dist.init_process_group("gloo", init_method="env://")
rank, world = dist.get_rank(), dist.get_world_size()

t = torch.tensor([float(rank + 1)])
dist.all_reduce(t)
expected = world * (world + 1) / 2
assert t.item() == expected, (t.item(), expected)

torch.manual_seed(0)
model = DDP(torch.nn.Linear(4, 1))
loss = model(torch.full((2, 4), float(rank))).sum()
loss.backward()
grads = [p.grad.clone() for p in model.parameters()]
for g in grads:
    gathered = [torch.zeros_like(g) for _ in range(world)]
    dist.all_gather(gathered, g)
    assert all(torch.equal(x, gathered[0]) for x in gathered), "DDP grads differ"
print("rank %d/%d allreduce ok sum=%s ddp ok" % (rank, world, t.item()), flush=True)
dist.destroy_process_group()
