"""A rank that is an MPI process (mpi4py): it records its MPI world next to
dslaunch's (OUT_DIR/mpi-RANK.json) and a start file as rank.py does, then
by its arguments (after DeepSpeed's --local_rank=N) exits, fails or sleeps:
  mpi_rank.py [ok | fail R | fail_first R | sleep] [ARGS...]
(fail_first: rank R fails in the first generation only, DSLAUNCH_RESTART_COUNT
unset or 0.)
Needs Debian's python3-mpi4py (run it with /usr/bin/python3)."""
import json
import os
import sys
import time

OUT = os.environ["OUT_DIR"]
with open(os.path.join(OUT, "start-" + os.environ["RANK"]), "w") as f:
    f.write("%d %d" % (time.time_ns(), os.getpid()))

from mpi4py import MPI  # noqa: E402  (after the start file: MPI_Init may hang)

from rank import my_address  # noqa: E402

KEYS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "NODE_RANK", "OMPI_MCA_btl",
        "DSLAUNCH_AGENT_SECRET", "DSLAUNCH_MPI_KEY", "DSLAUNCH_JOB_ID", "PMIX_RANK",
        "OMPI_COMM_WORLD_LOCAL_RANK", "SLURM_PROCID", "DSLAUNCH_RESTART_COUNT")

c = MPI.COMM_WORLD
args = [a for a in sys.argv[1:] if not a.startswith("--local_rank=")]
with open(os.path.join(OUT, "mpi-%s.json" % os.environ["RANK"]), "w") as f:
    json.dump({"mpi_rank": c.Get_rank(), "mpi_size": c.Get_size(),
               "sum": c.allreduce(c.Get_rank()), "argv": sys.argv,
               "address": my_address(), "host": MPI.Get_processor_name(),
               "env": {k: os.environ.get(k) for k in KEYS}}, f)
print("mpi rank %d of %d" % (c.Get_rank(), c.Get_size()), flush=True)
mode = args[0] if args else ""
if mode == "fail" and c.Get_rank() == int(args[1]):
    os._exit(7)
first = os.environ.get("DSLAUNCH_RESTART_COUNT", "0") in ("", "0")
if mode == "fail_first" and first and c.Get_rank() == int(args[1]):
    os._exit(7)
if mode == "fail_first" and first:
    time.sleep(60)
if mode in ("fail", "sleep"):
    time.sleep(60)
