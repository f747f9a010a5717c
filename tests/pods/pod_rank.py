"""The rank program of the pod suite. Usage: pod_rank.py MODE [ARGS...]

Every mode first writes what the rank saw to $TMPDIR/rank-<RANK>.json (its
ids, hostname, environment, whether its UID has a passwd entry, what a write
outside TMPDIR gets) and then its start, "<time ns> <pid>", to
$OUT_DIR/start-<RANK> (a volume every pod mounts, for the coordination
below). Modes:
  record          exit 0
  sleep           sleep 60 s
  fail R CODE     rank R waits until every rank has started, then exits CODE;
                  the others sleep 60 s
  later           generation 0 (DSLAUNCH_RESTART_COUNT) sleeps 60 s, later
                  generations exit 0
Standard library only: it runs under /usr/bin/python3 as any UID.
"""
import errno
import json
import os
import pwd
import socket
import sys
import time

RANK = int(os.environ["RANK"])
ENV_KEYS = ("RANK", "NODE_RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "HOME",
            "TMPDIR", "JOB_COMPLETION_INDEX", "KUBERNETES_SERVICE_HOST")


def write_outside_tmpdir():
    """errno name of creating a file in / (the pod's root is read-only)."""
    try:
        fd = os.open("/pod-rank-%d.probe" % RANK, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except OSError as e:
        return errno.errorcode.get(e.errno, str(e.errno))
    os.close(fd)
    return "written"


def has_passwd_entry():
    try:
        pwd.getpwuid(os.getuid())
        return True
    except KeyError:
        return False


def record():
    seen = {
        "uid": os.getuid(), "euid": os.geteuid(), "gid": os.getgid(),
        "groups": os.getgroups(), "pid": os.getpid(), "hostname": socket.gethostname(),
        "cwd": os.getcwd(), "passwd_entry": has_passwd_entry(),
        "write_outside_tmpdir": write_outside_tmpdir(),
        "env": {k: os.environ.get(k) for k in ENV_KEYS},
    }
    tmp = os.path.join(os.environ["TMPDIR"], ".rank-%d.json" % RANK)
    with open(tmp, "w") as f:
        json.dump(seen, f)
    os.rename(tmp, os.path.join(os.environ["TMPDIR"], "rank-%d.json" % RANK))
    out = os.environ["OUT_DIR"]
    tmp = os.path.join(out, ".start-%d.tmp" % RANK)
    with open(tmp, "w") as f:
        f.write("%d %d\n" % (time.time_ns(), os.getpid()))
    os.rename(tmp, os.path.join(out, "start-%d" % RANK))


def started():
    return len([n for n in os.listdir(os.environ["OUT_DIR"]) if n.startswith("start-")])


def main(mode, args):
    record()
    if mode == "record":
        return 0
    if mode == "fail" and RANK == int(args[0]):
        deadline = time.monotonic() + 30
        while started() < int(os.environ["WORLD_SIZE"]) and time.monotonic() < deadline:
            time.sleep(0.01)
        print("rank %d fails with exit %s" % (RANK, args[1]), flush=True)
        return int(args[1])
    if mode == "later":
        if os.environ.get("DSLAUNCH_RESTART_COUNT", "0") != "0":
            return 0
        mode = "sleep"
    if mode in ("sleep", "fail"):
        time.sleep(60)
        return 0
    print("pod_rank.py: unknown mode %r" % mode, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2:]))
