"""A Horovod rank (horovod.torch over Gloo, started the way horovodrun starts
one, but by dslaunch): what Horovod says of the world, a sum by allreduce,
then the same again after hvd.shutdown() and hvd.init() (a second rendezvous
in the same scopes; not with HVD_REINIT=0, as under MPI, which cannot start
twice). Writes OUT_DIR/hvd-<rank>.json. With FAIL_RANK=N, rank N
dies (exit status 3) after the first allreduce while the others wait in the
next one."""
import json
import os

import horovod.torch as hvd
import torch


def world():
    hvd.init()
    w = {"rank": hvd.rank(), "size": hvd.size(), "local_rank": hvd.local_rank(),
         "local_size": hvd.local_size(), "cross_rank": hvd.cross_rank(),
         "cross_size": hvd.cross_size(), "mpi": hvd.mpi_enabled(),
         "gloo": hvd.gloo_enabled()}
    w["sum"] = hvd.allreduce(torch.tensor([float(hvd.rank() + 1)]), op=hvd.Sum).item()
    return w


first = world()
print("horovod rank %d/%d sum=%g" % (first["rank"], first["size"], first["sum"]), flush=True)
fail = os.environ.get("FAIL_RANK")
if fail is not None:
    if int(fail) == first["rank"]:
        print("rank %d fails on purpose" % first["rank"], flush=True)
        os._exit(3)  # as a crash does: no hvd.shutdown() at exit
    hvd.allreduce(torch.tensor([1.0]), op=hvd.Sum)  # waits for the failed one
    raise SystemExit(0)
if os.environ.get("HVD_REINIT", "1") == "1":  # MPI cannot start twice
    hvd.shutdown()
    second = world()
else:
    second = first
env = {k: os.environ.get(k) for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE",
                                      "NODE_RANK", "GROUP_WORLD_SIZE")}
with open(os.path.join(os.environ["OUT_DIR"], "hvd-%d.json" % first["rank"]), "w") as f:
    json.dump({"first": first, "second": second, "env": env}, f)
