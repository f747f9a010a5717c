"""The bits of dslaunch's wire protocol a rank's store client needs, in pure
Python: each message is a 4-byte big-endian length and one serialized
wire.Envelope (proto/dslaunch.proto), whose field 13 is a StoreRequest and
14 a StoreResponse. Only the fields used here are encoded or decoded."""
import struct

ENVELOPE_STORE_REQUEST = 13
ENVELOPE_STORE_RESPONSE = 14
MAX_FRAME = 16 << 20  # proto/frame_codec.h's kDefaultMaxFrameBytes

# StoreRequest.Op
SET, GET, WAIT, ADD, CHECK, DELETE = range(6)
# StoreResponse.ErrorCode
UNSPECIFIED, TIMEOUT, LIMIT, INVALID, CLOSED = range(5)


def _varint(n):
    if n < 0:
        n += 1 << 64  # int64 as protobuf writes it: ten bytes
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def _key(field, wire_type):
    return _varint((field << 3) | wire_type)


def _bytes_field(field, data):
    return _key(field, 2) + _varint(len(data)) + data


def encode_store_request(req_id, op, keys=(), value=b"", delta=0, timeout_ms=0):
    """StoreRequest{id=1, op=2, keys=3, value=4, delta=5, timeout_ms=6} in an
    Envelope, framed."""
    body = _key(1, 0) + _varint(req_id)
    if op:
        body += _key(2, 0) + _varint(op)
    for k in keys:
        body += _bytes_field(3, k.encode("utf-8"))
    if value:
        body += _bytes_field(4, value)
    if delta:
        body += _key(5, 0) + _varint(delta)
    if timeout_ms:
        body += _key(6, 0) + _varint(timeout_ms)
    envelope = _bytes_field(ENVELOPE_STORE_REQUEST, body)
    return struct.pack(">I", len(envelope)) + envelope


def _read_varint(data, pos):
    n = shift = 0
    while True:
        if pos >= len(data) or shift > 63:
            raise ValueError("malformed varint")
        b = data[pos]
        pos += 1
        n |= (b & 0x7F) << shift
        shift += 7
        if not b & 0x80:
            return n, pos


def _fields(data):
    """(field, wire type, value) of each field; unknown ones are kept too."""
    pos = 0
    while pos < len(data):
        key, pos = _read_varint(data, pos)
        field, wire_type = key >> 3, key & 7
        if wire_type == 0:
            value, pos = _read_varint(data, pos)
        elif wire_type == 2:
            size, pos = _read_varint(data, pos)
            if pos + size > len(data):
                raise ValueError("truncated field")
            value, pos = data[pos:pos + size], pos + size
        elif wire_type == 1:
            value, pos = data[pos:pos + 8], pos + 8
        elif wire_type == 5:
            value, pos = data[pos:pos + 4], pos + 4
        else:
            raise ValueError("unknown wire type %d" % wire_type)
        yield field, wire_type, value


def decode_store_response(envelope):
    """The StoreResponse in an Envelope as a dict: id, ok, value, error,
    ready, code. ValueError when the Envelope holds none."""
    for field, wire_type, value in _fields(envelope):
        if field == ENVELOPE_STORE_RESPONSE and wire_type == 2:
            r = {"id": 0, "ok": False, "value": b"", "error": "", "ready": False,
                 "code": UNSPECIFIED}
            for f, t, v in _fields(value):
                if f == 1 and t == 0:
                    r["id"] = v
                elif f == 2 and t == 0:
                    r["ok"] = bool(v)
                elif f == 3 and t == 2:
                    r["value"] = bytes(v)
                elif f == 4 and t == 2:
                    r["error"] = bytes(v).decode("utf-8", "replace")
                elif f == 5 and t == 0:
                    r["ready"] = bool(v)
                elif f == 6 and t == 0:
                    r["code"] = v
            return r
    raise ValueError("not a store response")
