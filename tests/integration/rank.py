"""A rank program for the integration tests. Usage: rank.py MODE [ARGS...]

Every mode first records its start (time, pid) in $OUT_DIR/start-<rank>.
"""
import json
import os
import signal
import socket
import sys
import time

RANK = int(os.environ.get("RANK", "0"))
OUT = os.environ.get("OUT_DIR", "/tmp")


def record_start():
    # Written under a temporary name and renamed: readers never see half a file.
    tmp = os.path.join(OUT, ".start-%d.tmp" % RANK)
    with open(tmp, "w") as f:
        f.write("%d %d\n" % (time.time_ns(), os.getpid()))
    os.rename(tmp, os.path.join(OUT, "start-%d" % RANK))


def my_address():
    """The address this rank's node uses toward MASTER_ADDR (its namespace's)."""
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        s.connect((os.environ.get("MASTER_ADDR", "127.0.0.1"), 9))
        return s.getsockname()[0]
    finally:
        s.close()


def mode_env(_args):
    keys = json.loads(os.environ["ENV_KEYS"])
    record = {k: os.environ.get(k) for k in keys}
    record["__address__"] = my_address()
    with open(os.path.join(OUT, "env-%d.json" % RANK), "w") as f:
        json.dump(record, f)
    with open(os.path.join(OUT, "argv-%d.json" % RANK), "w") as f:
        json.dump(sys.argv[2:], f)


def mode_fail(args):
    """fail RANK HOW: that rank fails after every rank started; others sleep."""
    victim, how = int(args[0]), args[1]
    world = int(os.environ["WORLD_SIZE"])
    if RANK != victim:
        time.sleep(60)
        return
    while len([n for n in os.listdir(OUT) if n.startswith("start-")]) < world:
        time.sleep(0.01)
    print("rank %d about to fail with %s" % (RANK, how), flush=True)
    if how.startswith("exit"):
        sys.exit(int(how[4:]))
    sig = getattr(signal, how)
    if sig not in (signal.SIGKILL, signal.SIGSTOP):
        signal.signal(sig, signal.SIG_DFL)
    os.kill(os.getpid(), sig)
    time.sleep(5)


def mode_sleep(args):
    """sleep [ignore-term]: print a line, then sleep; maybe ignore SIGTERM."""
    if args and args[0] == "ignore-term":
        signal.signal(signal.SIGTERM, lambda *_: print("ignoring SIGTERM", flush=True))
    print("sleeping", flush=True)
    for _ in range(600):
        time.sleep(0.1)


def mode_spam(args):
    """spam N: write N numbered lines to stdout (and every 10th to stderr) fast."""
    n = int(args[0])
    out = sys.stdout.buffer
    for i in range(n):
        line = b"rank %d line %d %s\n" % (RANK, i, b"x" * (i % 50))
        if i % 10 == 0:
            sys.stderr.buffer.write(line)
        else:
            out.write(line)
    out.flush()
    sys.stderr.flush()


def mode_last_words(_args):
    """Rank 1 writes a line and an unterminated tail, then SIGKILLs itself."""
    if RANK != 1:
        time.sleep(60)
        return
    sys.stdout.write("first words\nlast words without newline")
    sys.stdout.flush()
    os.kill(os.getpid(), signal.SIGKILL)


def mode_progress(args):
    """progress N: report N records plus garbage through DSLAUNCH_PROGRESS."""
    n = int(args[0])
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.connect(os.environ["DSLAUNCH_PROGRESS"])
    for step in range(n):
        rec = {"step": step, "loss": 1.0 / (step + 1), "tokens_per_s": 1000 + step}
        s.sendall((json.dumps(rec) + "\n").encode())
        if step == 1:
            s.sendall(b"this is not json\n[1, 2, 3]\n{broken\n")
    s.close()
    print("reported %d" % n, flush=True)


if __name__ == "__main__":
    record_start()
    globals()["mode_" + sys.argv[1]](sys.argv[2:])
