"""A rank that reports progress, for the console, hang and sink tests.
Usage: progress_rank.py MODE [ARGS...]; every mode records its start as rank.py
does ($OUT_DIR/start-<rank>) and writes records to $DSLAUNCH_PROGRESS.

  train STEPS DELAY [SLOW_RANK FACTOR]  STEPS records DELAY s apart (SLOW_RANK's
                                        FACTOR times slower), printing
                                        "same text on every rank" at each step
  hang RANK STEPS DELAY PAUSE           like train, but RANK stops reporting after
                                        3 steps for PAUSE s (sleeping: it still runs)
  torch_error                           raises RuntimeError("boom from rank R")
                                        under torch's @record (error file)
"""
import json
import os
import socket
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import rank  # noqa: E402  record_start

RANK = int(os.environ.get("RANK", "0"))


def connect():
    s = socket.socket(socket.AF_UNIX)
    s.connect(os.environ["DSLAUNCH_PROGRESS"])
    return s


def report(s, step, total):
    record = {"step": step, "total_steps": total, "loss": round(4.0 / step + RANK * 0.001, 6),
              "tokens_per_s": 1000.0 + RANK}
    s.sendall((json.dumps(record) + "\n").encode())


def mode_train(args):
    steps, delay = int(args[0]), float(args[1])
    slow_rank = int(args[2]) if len(args) > 2 else -1
    factor = float(args[3]) if len(args) > 3 else 1.0
    s = connect()
    for step in range(1, steps + 1):
        time.sleep(delay * (factor if RANK == slow_rank else 1.0))
        report(s, step, steps)
        print("same text on every rank", flush=True)


def mode_hang(args):
    victim, steps, delay, pause = int(args[0]), int(args[1]), float(args[2]), float(args[3])
    s = connect()
    for step in range(1, steps + 1):
        if RANK == victim and step == 4:
            time.sleep(pause)
        time.sleep(delay)
        report(s, step, steps)


def mode_torch_error(_args):
    from torch.distributed.elastic.multiprocessing.errors import record

    @record
    def main():
        raise RuntimeError("boom from rank %d" % RANK)

    main()


if __name__ == "__main__":
    rank.record_start()
    {"train": mode_train, "hang": mode_hang, "torch_error": mode_torch_error}[sys.argv[1]](sys.argv[2:])
