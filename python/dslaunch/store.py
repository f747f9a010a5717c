"""The job's key/value store (torch.distributed's TCPStore semantics: set,
get that waits, add, wait, check, delete), through the rank's agent
(DSLAUNCH_STORE = "unix:PATH"): the agent relays each request over its
authenticated connection to the launcher, so a rank needs no credentials.
Values are bytes (str is encoded as UTF-8). Outside dslaunch every call is a
no-op (get returns None), said once as a warning. Thread-safe: one request
at a time per process."""
import itertools
import os
import socket
import struct
import threading
import warnings

from . import _wire

__all__ = ["StoreError", "StoreTimeout", "set", "get", "add", "wait", "check",
           "delete"]


class StoreError(RuntimeError):
    """The launcher refused a request (a quota, an invalid request, the job
    ended); the message says which."""


class StoreTimeout(StoreError, TimeoutError):
    """get() or wait() ran past its timeout."""


_lock = threading.Lock()
_sock = None
_ids = itertools.count(1)
_warned = False


def _address():
    addr = os.environ.get("DSLAUNCH_STORE", "")
    if not addr:
        global _warned
        if not _warned:
            _warned = True
            warnings.warn("dslaunch.store used outside dslaunch: a no-op",
                          RuntimeWarning, stacklevel=4)
        return None
    if not addr.startswith("unix:"):
        raise StoreError("DSLAUNCH_STORE %r is not unix:PATH" % addr)
    return addr[len("unix:"):]


def _read_exact(s, n):
    data = bytearray()
    while len(data) < n:
        chunk = s.recv(n - len(data))
        if not chunk:
            raise StoreError("the agent closed the store connection")
        data += chunk
    return bytes(data)


def _call(op, keys=(), value=b"", delta=0, timeout=None):
    path = _address()
    if path is None:
        return None
    if timeout is not None and timeout < 0:
        raise ValueError("timeout must be >= 0 seconds (None: forever)")
    timeout_ms = 0 if timeout is None else max(1, int(timeout * 1000))
    global _sock
    with _lock:
        if _sock is None:
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            s.connect(path)
            _sock = s
        req_id = next(_ids)
        frame = _wire.encode_store_request(req_id, op, keys, value, delta, timeout_ms)
        if len(frame) > _wire.MAX_FRAME:
            raise StoreError("request of %d bytes is larger than the %d-byte frame limit"
                             % (len(frame), _wire.MAX_FRAME))
        try:
            _sock.sendall(frame)
            (length,) = struct.unpack(">I", _read_exact(_sock, 4))
            if length == 0 or length > _wire.MAX_FRAME:
                raise StoreError("malformed reply of %d bytes" % length)
            reply = _wire.decode_store_response(_read_exact(_sock, length))
        except (OSError, ValueError, StoreError):
            _sock.close()
            _sock = None
            raise
    if reply["id"] != req_id:
        raise StoreError("reply %d to request %d" % (reply["id"], req_id))
    if not reply["ok"]:
        cls = StoreTimeout if reply["code"] == _wire.TIMEOUT else StoreError
        raise cls(reply["error"] or "store request failed")
    return reply


def _bytes(value):
    if isinstance(value, str):
        return value.encode("utf-8")
    return bytes(value)


def set(key, value):  # noqa: A001  (the store's own verb)
    _call(_wire.SET, [key], value=_bytes(value))


def get(key, timeout=None):
    """The value of `key`, waiting for it to be set (timeout in seconds;
    None waits for ever). Raises StoreTimeout."""
    r = _call(_wire.GET, [key], timeout=timeout)
    return None if r is None else r["value"]


def add(key, delta=1):
    """Adds `delta` to the integer at `key` (0 if unset); the new value."""
    r = _call(_wire.ADD, [key], delta=int(delta))
    return None if r is None else int(r["value"].decode() or "0")


def wait(keys, timeout=None):
    """Blocks until every key in `keys` is set. Raises StoreTimeout."""
    _call(_wire.WAIT, list(keys), timeout=timeout)


def check(keys):
    """Whether every key in `keys` is set, without waiting."""
    r = _call(_wire.CHECK, list(keys))
    return None if r is None else r["ready"]


def delete(key):
    _call(_wire.DELETE, [key])
