"""A rank that tries to outlive its job, for test_descendants. Usage:
escape_rank.py escape EXIT|hang   start a setsid grandchild, a background child
                                  and a double-forked daemon with its pipes
                                  closed; write their pids to
                                  $OUT_DIR/desc-<rank>.json; then exit EXIT or
                                  sleep ("hang")
escape_rank.py peek               try to read the agent's (the parent's)
                                  /proc/<pid>/mem and environ, and the
                                  launcher's environ (local starter); write
                                  the outcome to $OUT_DIR/peek-<rank>.json
"""
import errno
import json
import os
import sys
import time

from rank import OUT, RANK, record_start


def write_pid(name):
    tmp = os.path.join(OUT, ".%s-%d.tmp" % (name, RANK))
    with open(tmp, "w") as f:
        f.write(str(os.getpid()))
    os.rename(tmp, os.path.join(OUT, "%s-%d" % (name, RANK)))


def linger(name, setsid=False, close_pipes=False):
    if setsid:
        os.setsid()
    if close_pipes:
        null = os.open("/dev/null", os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(null, fd)
        os.closerange(3, 1024)
    write_pid(name)
    time.sleep(300)
    os._exit(0)


def spawn_escapes():
    if os.fork() == 0:
        linger("setsid", setsid=True)
    if os.fork() == 0:
        linger("background")
    middle = os.fork()
    if middle == 0:  # the classic daemon: fork, setsid, fork, close all
        os.setsid()
        if os.fork() == 0:
            linger("daemon", close_pipes=True)
        os._exit(0)
    os.waitpid(middle, 0)
    names = ("setsid", "background", "daemon")
    deadline = time.monotonic() + 20
    while not all(os.path.exists(os.path.join(OUT, "%s-%d" % (n, RANK))) for n in names):
        if time.monotonic() > deadline:
            sys.exit(70)
        time.sleep(0.01)
    pids = {}
    for n in names:
        with open(os.path.join(OUT, "%s-%d" % (n, RANK))) as f:
            pids[n] = int(f.read())
    tmp = os.path.join(OUT, ".desc-%d.tmp" % RANK)
    with open(tmp, "w") as f:
        json.dump(pids, f)
    os.rename(tmp, os.path.join(OUT, "desc-%d.json" % RANK))


def try_read(path, read=True):
    try:
        with open(path, "rb") as f:
            if read:
                f.read(1)
        return "ok"
    except OSError as e:
        return errno.errorcode.get(e.errno, str(e.errno))


def main():
    record_start()
    mode = sys.argv[1]
    if mode == "escape":
        spawn_escapes()
        print("ready", flush=True)
        if sys.argv[2] == "hang":
            time.sleep(300)
        sys.exit(int(sys.argv[2]))
    if mode == "peek":
        agent = os.getppid()
        with open("/proc/%d/stat" % agent) as f:  # readable by anyone
            launcher = int(f.read().rsplit(")", 1)[1].split()[1])
        result = {"agent": agent, "uid": os.getuid(),
                  "mem": try_read("/proc/%d/mem" % agent, read=False),
                  "environ": try_read("/proc/%d/environ" % agent),
                  "launcher_environ": try_read("/proc/%d/environ" % launcher)}
        with open(os.path.join(OUT, "peek-%d.json" % RANK), "w") as f:
            json.dump(result, f)
        sys.exit(0)
    sys.exit(64)


if __name__ == "__main__":
    main()
