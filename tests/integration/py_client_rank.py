"""A rank that uses dslaunch's Python client (python/dslaunch): three
progress records, then the store across the job's ranks; what it saw goes
to OUT_DIR/py-RANK.json."""
import json
import os
import sys

sys.path.insert(0, os.environ["DSLAUNCH_PY_CLIENT"])
import dslaunch  # noqa: E402

r = dslaunch.rank()
world = dslaunch.world_size()
sent = [dslaunch.report(step=s, loss=1.0 / s, tokens_per_s=100.0 * (r + 1))
        for s in (1, 2, 3)]
dslaunch.report(step=4, loss=float("nan"))  # a diverged step keeps its record
dslaunch.store.set("r%d" % r, "hello %d" % r)
count = dslaunch.store.add("count", 1)
dslaunch.store.wait(["r%d" % i for i in range(world)], timeout=30)
values = [dslaunch.store.get("r%d" % i, timeout=30).decode() for i in range(world)]
try:
    dslaunch.store.get("never-set", timeout=0.2)
    timed_out = False
except dslaunch.store.StoreTimeout:
    timed_out = True
try:
    dslaunch.store.add("r0", 1)  # not an integer
    refused = ""
except dslaunch.store.StoreError as e:
    refused = str(e)
with open(os.path.join(os.environ["OUT_DIR"], "py-%d.json" % r), "w") as f:
    json.dump({"sent": sent, "count": count, "values": values, "timed_out": timed_out,
               "checked": dslaunch.store.check(["r0", "count"]),
               "absent": dslaunch.store.check(["never-set"]), "refused": refused,
               "in_dslaunch": dslaunch.in_dslaunch()}, f)
