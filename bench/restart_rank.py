"""The program bench/restart.sh has dslaunch and torchrun restart. Every rank
writes, first thing, its start time to BENCH_DIR/start.<generation>.<rank>.
Generation 0: the last rank waits until every rank started, writes the time
to BENCH_DIR/fail and exits 1; the others sleep until they are stopped.
Later generations: every rank joins a Gloo process group at MASTER_ADDR:
MASTER_PORT (the rendezvous the launcher gave), passes a barrier and writes
the time to BENCH_DIR/progress.<rank>: the first step after the resume.

The generation is told by BENCH_DIR/fail, not by TORCHELASTIC_RESTART_COUNT:
torchrun counts restarts per agent (an agent that restarts its workers
because another's failed keeps its count), dslaunch per job."""
import os
import sys
import time


def stamp(name):
    with open(os.path.join(os.environ["BENCH_DIR"], name), "w") as f:
        f.write("%d\n" % time.time_ns())


def main():
    out = os.environ["BENCH_DIR"]
    generation = 1 if os.path.exists(os.path.join(out, "fail")) else 0
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    stamp("start.%d.%d" % (generation, rank))
    if generation == 0:
        if rank != world - 1:
            time.sleep(600)
            return 0
        prefix = "start.0."
        while sum(n.startswith(prefix) for n in os.listdir(out)) < world:
            time.sleep(0.005)
        time.sleep(float(os.environ.get("BENCH_SETTLE_S", "0.2")))
        stamp("fail")
        os._exit(1)
    import torch.distributed as dist
    dist.init_process_group("gloo")
    dist.barrier()
    stamp("progress.%d" % rank)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
