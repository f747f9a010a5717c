"""Soak of --max_restarts: N runs of dsworker on 3 local nodes, each with
random faults at random moments, every run checked against one
uninterrupted run.

usage: DSL_BIN=build/bin python3 tests/integration/soak_restarts.py [--runs 20] [--seed S]

A fault is one of: a rank SIGKILLed, a rank SIGTERMed alone, an agent
SIGKILLed, an agent frozen (SIGSTOP: its heartbeats stop, the launcher
counts the node lost, kills the agent and starts it again). Each run has
one or two faults. Each run must end 0 with every loss after the last
restart equal, bit for bit, to the uninterrupted run's at that step, and
nothing of it may be left: no dsworker, no dsagent. The seed is printed
first; a failing run says its seed and faults. Exit 0 when every run
passed, 1 otherwise.
"""
import argparse
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time

BIN = os.environ.get("DSL_BIN", os.path.join(os.path.dirname(__file__), "../../build/bin"))
DSLAUNCH = os.path.join(BIN, "dslaunch")
DSWORKER = os.path.join(BIN, "dsworker")
STEPS = 300
CORPUS = ("In the beginning God created the heaven and the earth. And the earth was "
          "without form, and void; and darkness was upon the face of the deep. ") * 300
FAULTS = ("rank SIGKILL", "rank SIGTERM", "agent SIGKILL", "agent SIGSTOP")


def config(work, ck):
    cfg = {
        "train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 1,
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "weight_decay": 0.1}},
        "gradient_clipping": 1.0, "steps_per_print": 1, "zero_optimization": {"stage": 2},
        "model": {"n_layer": 2, "n_head": 2, "n_embd": 32, "seq_len": 16, "vocab_size": 300},
        "data": {"train": os.path.join(work, "data", "train_000.bin"), "shuffle": False},
        "train": {"steps": STEPS, "seed": 7},
    }
    if ck:
        cfg["checkpoint"] = {"dir": ck, "every": 10}
    path = os.path.join(work, "ds-%s.json" % ("ck" if ck else "whole"))
    with open(path, "w") as f:
        json.dump(cfg, f)
    return path


def hostfile(work):
    path = os.path.join(work, "hosts")
    with open(path, "w") as f:
        f.write("".join("127.0.0.%d slots=1\n" % i for i in (1, 2, 3)))
    return path


def launch(work, logs, cfg, extra=()):
    env = dict(os.environ, OMP_NUM_THREADS="1", DSL_SOAK=work)
    return subprocess.Popen(
        [DSLAUNCH, "--hostfile", hostfile(work), "--launcher", "local", "--no_local_rank",
         "--log_dir", logs, *extra, DSWORKER, "train", "--config", cfg],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env)


def records(logs):
    try:
        with open(os.path.join(logs, "metrics.jsonl")) as f:
            lines = f.read().split("\n")[:-1]
    except FileNotFoundError:
        return []
    return [json.loads(line) for line in lines if line]


def descendants(root):
    """{pid: (parent pid, argv)} of every live descendant of `root`."""
    children = {}
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open("/proc/%s/stat" % pid) as f:
                fields = f.read().rsplit(")", 1)[1].split()
            with open("/proc/%s/cmdline" % pid, "rb") as f:
                argv = f.read().split(b"\0")
        except OSError:
            continue
        if fields[0] != "Z":
            children.setdefault(int(fields[1]), []).append((int(pid), argv))
    found, todo = {}, [root]
    while todo:
        parent = todo.pop()
        for pid, argv in children.get(parent, []):
            found[pid] = (parent, argv)
            todo.append(pid)
    return found


def marked(work):
    """Live pids whose environment holds DSL_SOAK=work: everything a run
    started (launcher, agents, ranks, whatever they left), wherever it was
    reparented."""
    marker = ("DSL_SOAK=%s" % work).encode()
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open("/proc/%s/environ" % pid, "rb") as f:
                if marker not in f.read().split(b"\0"):
                    continue
            with open("/proc/%s/stat" % pid) as f:
                if f.read().rsplit(")", 1)[1].split()[0] == "Z":
                    continue
        except OSError:
            continue
        found.append(int(pid))
    return found


def pick(job, kind, rng):
    """The pid of a random rank (dsworker) or agent of `job`: a dsagent whose
    parent is the launcher (its containment guard is a fork of it, with the
    same command line, one level down)."""
    if kind == "rank":
        pids = [pid for pid, (_, argv) in descendants(job.pid).items()
                if os.path.basename(argv[0]) == b"dsworker"]
    else:
        pids = [pid for pid, (parent, argv) in descendants(job.pid).items()
                if os.path.basename(argv[0]) == b"dsagent" and parent == job.pid]
    return rng.choice(pids) if pids else None


def one_run(work, whole, run, rng):
    ck = os.path.join(work, "ck-%d" % run)
    logs = os.path.join(work, "logs-%d" % run)
    job = launch(work, logs, config(work, ck),
                 ["--max_restarts", "4", "--restart_backoff", "0",
                  "--heartbeat_interval", "0.2", "--heartbeat_timeout", "1",
                  "--kill_grace", "2"])
    faults = [rng.choice(FAULTS) for _ in range(rng.randint(1, 2))]
    done = []
    try:
        for fault in faults:
            at = rng.randint(5, STEPS // 2)
            deadline = time.monotonic() + 60
            while max((r.get("step", 0) for r in records(logs)), default=0) < at:
                if job.poll() is not None or time.monotonic() > deadline:
                    break
                time.sleep(0.01)
            kind, sig = fault.split()
            pid = pick(job, kind, rng)
            if pid is None:
                continue
            os.kill(pid, getattr(signal, sig))
            done.append("%s at step >= %d" % (fault, at))
            time.sleep(rng.uniform(0, 0.5))
        err = job.communicate(timeout=180)[1].decode()
    except subprocess.TimeoutExpired:
        job.kill()
        err = job.communicate()[1].decode()
        return False, done, "did not end within 180 s\n" + err[-3000:]
    if job.returncode != 0:
        return False, done, "exit %d\n%s" % (job.returncode, err[-3000:])
    got = records(logs)
    restarts = [i for i, r in enumerate(got) if r.get("event") == "restart"]
    after = got[restarts[-1] + 1:] if restarts else got
    losses = {r["step"]: r["loss"] for r in after if r.get("rank") == 0}
    if STEPS not in losses:
        return False, done, "no record of the last step"
    for step, loss in losses.items():
        if loss != whole[step]:
            return False, done, "step %d: loss %r, uninterrupted %r" % (step, loss, whole[step])
    deadline = time.monotonic() + 5
    while marked(work):
        if time.monotonic() > deadline:
            return False, done, "left running: pids %s" % marked(work)
        time.sleep(0.05)
    return True, done, "%d restart(s)" % len(restarts)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--seed", type=int, default=time.time_ns() % 1000000)
    args = ap.parse_args()
    print("soak_restarts: seed %d, %d runs" % (args.seed, args.runs), flush=True)
    rng = random.Random(args.seed)
    work = tempfile.mkdtemp(prefix="dsl-soak-")
    try:
        with open(os.path.join(work, "corpus.txt"), "w") as f:
            f.write(CORPUS)
        subprocess.run([DSWORKER, "prepare", "--input", os.path.join(work, "corpus.txt"),
                        "--out", os.path.join(work, "data"), "--vocab", "300"],
                       check=True, capture_output=True, timeout=120)
        job = launch(work, os.path.join(work, "logs-whole"), config(work, None))
        err = job.communicate(timeout=300)[1].decode()
        if job.returncode != 0:
            print("the uninterrupted run failed:\n" + err[-3000:])
            return 1
        whole = {r["step"]: r["loss"] for r in records(os.path.join(work, "logs-whole"))
                 if r.get("rank") == 0}
        failed = 0
        for run in range(args.runs):
            ok, faults, what = one_run(work, whole, run, rng)
            print("run %2d %s: %s; %s" % (run, "ok  " if ok else "FAIL", ", ".join(faults) or
                                         "no fault landed", what), flush=True)
            failed += not ok
        print("soak_restarts: %d of %d runs passed (seed %d)" %
              (args.runs - failed, args.runs, args.seed))
        return 1 if failed else 0
    finally:
        for pid in marked(work):  # only what this soak started
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
