"""The demo's rank program: any script works with dslaunch; this one shows
the env contract, live output, and progress reports over DSLAUNCH_PROGRESS."""
import argparse
import json
import os
import socket
import time

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=20)
parser.add_argument("--local_rank", type=int, default=0)  # given by dslaunch
args = parser.parse_args()

rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
print("rank %d of %d (node %s, local rank %d, GPUs %r, master %s:%s)" % (
    rank, world, os.environ["NODE_RANK"], args.local_rank,
    os.environ["CUDA_VISIBLE_DEVICES"], os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"]))

progress = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
progress.connect(os.environ["DSLAUNCH_PROGRESS"])
loss = 4.0
for step in range(1, args.steps + 1):
    time.sleep(0.1)
    loss *= 0.9
    if step % 5 == 0:
        print("step %d loss %.4f" % (step, loss))
    progress.sendall((json.dumps({"step": step, "loss": round(loss, 4),
                                  "samples_per_s": round(10 / 0.1, 1)}) + "\n").encode())
print("rank %d done" % rank)
