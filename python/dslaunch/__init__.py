"""dslaunch's client for training scripts: progress records and the job's
key/value store, pure Python (no dependency beyond the standard library).

    import dslaunch
    dslaunch.report(step=100, loss=2.31, tokens_per_s=51200)
    dslaunch.store.set("ready", b"1"); dslaunch.store.get("ready")

Under dslaunch a rank's records go to the live table, metrics.jsonl,
TensorBoard and Prometheus (DSLAUNCH_PROGRESS names its agent's socket), and
the store is the job's (DSLAUNCH_STORE). Outside dslaunch both are no-ops,
said once as a warning, so a script runs the same by hand.
"""
import json
import os
import socket
import threading
import warnings

from . import store  # noqa: F401  (dslaunch.store)

__all__ = ["report", "in_dslaunch", "rank", "world_size", "local_rank", "store"]

_lock = threading.Lock()
_sock = None
_warned = False


def in_dslaunch():
    """Whether this process is a rank that dslaunch started."""
    return bool(os.environ.get("DSLAUNCH_PROGRESS"))


def rank():
    return int(os.environ.get("RANK", "0"))


def world_size():
    return int(os.environ.get("WORLD_SIZE", "1"))


def local_rank():
    return int(os.environ.get("LOCAL_RANK", "0"))


def _warn_once(what):
    global _warned
    if not _warned:
        _warned = True
        warnings.warn("dslaunch: %s outside dslaunch: nothing is sent" % what,
                      RuntimeWarning, stacklevel=3)


def _number(v):
    if isinstance(v, bool):
        return int(v)
    if isinstance(v, (int, float)):
        return v
    # numpy and torch scalars (item()), without importing either.
    item = getattr(v, "item", None)
    if callable(item):
        v = item()
        if isinstance(v, (int, float)):
            return v
    raise TypeError("dslaunch.report: %r is not a number" % (v,))


def report(step=None, **fields):
    """Sends one progress record: `step` and any numeric fields (loss,
    tokens_per_s, lr, ...; numpy or torch scalars too). Non-finite values
    are sent as NaN/Infinity, which dslaunch keeps. Returns whether the
    record went out (False outside dslaunch, or once the agent is gone)."""
    global _sock
    path = os.environ.get("DSLAUNCH_PROGRESS")
    if not path:
        _warn_once("report()")
        return False
    record = {}
    if step is not None:
        record["step"] = int(_number(step))
    for k, v in fields.items():
        record[k] = _number(v)
    line = json.dumps(record, allow_nan=True, separators=(",", ":")) + "\n"
    with _lock:
        try:
            if _sock is None:
                s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                s.connect(path)
                _sock = s
            _sock.sendall(line.encode("utf-8"))
            return True
        except OSError:
            if _sock is not None:
                _sock.close()
            _sock = None
            return False
