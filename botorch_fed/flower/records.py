r"""Protocol messages as Flower records, and as bytes for a party's local socket.

A :class:`~botorch_fed.protocol.messages.Message` payload is a flat dict of numpy
arrays, bytes and scalars. On Flower it travels as a ``RecordDict`` with two records:
``"arrays"`` (an ``ArrayRecord``: every array, dtype and shape kept) and ``"config"``
(a ``ConfigRecord``: bytes, ``int``, ``float``, ``str``, ``bool``; numpy scalars become
Python ones). The protocol's message type ``t`` becomes Flower's ``query.t``.

Between the ``ClientApp`` process and the party's agent (:mod:`.party`) the same
payloads travel as bytes (:func:`encode_frame` / :func:`decode_frame`): a JSON header
naming each entry's kind, dtype and shape, then the raw array and bytes data. Nothing
is pickled, so a frame can carry only payload values.
"""

from __future__ import annotations

import json
import struct
from typing import Any

import numpy as np

from botorch_fed.protocol.payloads import validate_payload

CATEGORY = "query"
ARRAYS = "arrays"
CONFIG = "config"
#: the one record of a reply that says "still working on it, ask again"
PENDING_RECORD = "pending"
_MAX_HEADER = 1 << 24


def flower_type(type: str) -> str:
    r"""Flower's message type for the protocol's ``type`` (``query.<type>``).

    Raises:
        ValueError: ``type`` is not a Python identifier (Flower's rule for actions).
    """
    if not isinstance(type, str) or not type.isidentifier():
        raise ValueError(
            f"Message type {type!r} cannot travel on Flower: it must be a Python identifier."
        )
    return f"{CATEGORY}.{type}"


def protocol_type(flower_message_type: str) -> str:
    r"""The protocol's message type of Flower's ``query.<type>``.

    Raises:
        ValueError: Another category or an action that is not an identifier.
    """
    category, _, action = str(flower_message_type).partition(".")
    if category != CATEGORY or not action.isidentifier():
        raise ValueError(
            f"Flower message type {flower_message_type!r} is not a botorch-fed message "
            f"({CATEGORY}.<identifier>)."
        )
    return action


def _items(payload: dict):
    r"""The payload's entries, once :func:`~botorch_fed.protocol.payloads.validate_payload`
    passed it (the rules every message follows, in process as on Flower)."""
    return validate_payload(payload).items()


def _python_scalar(value):
    r"""A payload scalar as the Python scalar a ``ConfigRecord`` holds."""
    if isinstance(value, np.bool_ | bool):
        return bool(value)
    if isinstance(value, np.integer | int):
        return int(value)
    if isinstance(value, np.floating | float):
        return float(value)
    return value  # bytes or str


def to_records(payload: dict):
    r"""A payload as Flower's ``RecordDict`` (``"arrays"`` and ``"config"``).

    Raises:
        TypeError, ValueError: As :func:`~botorch_fed.protocol.payloads.validate_payload`: a
            value that is not a payload value, or one Flower's wire encoding cannot
            carry (naming its key).
    """
    from flwr.app import Array, ArrayRecord, ConfigRecord, RecordDict

    arrays, config = {}, {}
    for key, value in _items(payload):
        if isinstance(value, np.ndarray):
            arrays[key] = Array(np.asarray(value, order="C"))
        else:
            config[key] = _python_scalar(value)
    return RecordDict({ARRAYS: ArrayRecord(arrays), CONFIG: ConfigRecord(config)})


def from_records(content) -> dict:
    r"""The payload a ``RecordDict`` of :func:`to_records` holds.

    Raises:
        ValueError: Records other than ``"arrays"`` / ``"config"``, or a key in both.
    """
    names = set(content.keys())
    if not names <= {ARRAYS, CONFIG}:
        raise ValueError(
            f"A botorch-fed message holds the records {ARRAYS!r} and {CONFIG!r}, got "
            f"{sorted(names)}."
        )
    payload = {}
    if ARRAYS in names:
        for key, array in content[ARRAYS].items():
            payload[key] = array.numpy()
    if CONFIG in names:
        for key, value in content[CONFIG].items():
            if key in payload:
                raise ValueError(f"Payload entry {key!r} is both an array and a config value.")
            payload[key] = value
    return payload


def wire_bytes(message) -> int:
    r"""The bytes Flower stores and sends for ``message``: its content's serialised
    objects (records and array chunks), as the SuperLink's object store holds them."""
    from flwr.supercore.inflatable.inflatable_object import get_all_nested_objects

    return sum(len(obj.deflate()) for obj in get_all_nested_objects(message.content).values())


# --- bytes for the party's local socket -----------------------------------------------
def encode_frame(meta: dict, payload: dict) -> bytes:
    r"""``meta`` (JSON-able) and ``payload`` as one length-prefixed frame."""
    entries, blobs = [], []
    for key, value in _items(payload):
        if isinstance(value, np.ndarray):
            data = np.asarray(value, order="C")
            if data.dtype.byteorder == ">":
                data = data.astype(data.dtype.newbyteorder("<"))
            entries.append([key, "a", data.dtype.str, list(data.shape)])
            blobs.append(data.tobytes())
        elif isinstance(value, bytes):
            entries.append([key, "y", len(value)])
            blobs.append(value)
        else:
            scalar = _python_scalar(value)
            kind = {bool: "b", int: "i", float: "f", str: "s"}[type(scalar)]
            entries.append([key, kind, scalar if kind != "f" else scalar.hex()])
    header = json.dumps({"meta": meta, "entries": entries}).encode()
    body = struct.pack("<Q", len(header)) + header + b"".join(blobs)
    return struct.pack("<Q", len(body)) + body


def decode_frame(body: bytes) -> tuple[dict, dict]:
    r"""``(meta, payload)`` of a frame's body (the bytes after its length prefix).

    Raises:
        ValueError: A malformed frame.
    """
    try:
        (n,) = struct.unpack_from("<Q", body)
        if n > _MAX_HEADER or 8 + n > len(body):
            raise ValueError("header length out of range")
        header = json.loads(body[8 : 8 + n])
        offset = 8 + n
        payload: dict[str, Any] = {}
        if not isinstance(header, dict) or not isinstance(header["entries"], list):
            raise ValueError("the header is not a dict with a list of entries")
        for entry in header["entries"]:
            key, kind = entry[0], entry[1]
            if not isinstance(key, str) or key in payload:
                raise ValueError(f"entry key {key!r} is not a new str")
            if kind == "a":
                dtype = np.dtype(entry[2])
                if dtype.kind not in "biuf" or dtype.fields is not None:
                    raise ValueError(f"entry {key!r}: dtype {dtype} is not numeric")
                if not isinstance(entry[3], list) or not all(
                    type(d) is int and 0 <= d < 2**40 for d in entry[3]
                ):
                    raise ValueError(f"entry {key!r}: its shape is not a list of sizes")
                shape = tuple(entry[3])
                size = dtype.itemsize * int(np.prod(shape, dtype=np.int64))
                raw = body[offset : offset + size]
                if len(raw) != size:
                    raise ValueError(f"entry {key!r} is truncated")
                payload[key] = np.frombuffer(raw, dtype=dtype).reshape(shape).copy()
                offset += size
            elif kind == "y":
                size = entry[2]
                if type(size) is not int or size < 0:
                    raise ValueError(f"entry {key!r}: its length is not a size")
                raw = body[offset : offset + size]
                if len(raw) != size:
                    raise ValueError(f"entry {key!r} is truncated")
                payload[key] = bytes(raw)
                offset += size
            elif kind == "f":
                payload[key] = float.fromhex(entry[2])
            elif kind in ("b", "i", "s"):
                expected = {"b": bool, "i": int, "s": str}[kind]
                if type(entry[2]) is not expected:
                    raise ValueError(f"entry {key!r} is not a {expected.__name__}")
                payload[key] = entry[2]
            else:
                raise ValueError(f"entry {key!r} has unknown kind {kind!r}")
        if offset != len(body):
            raise ValueError(f"{len(body) - offset} trailing bytes")
        return header["meta"], payload
    except (
        KeyError,
        IndexError,
        TypeError,
        ValueError,
        OverflowError,
        RecursionError,
        struct.error,
    ) as exc:
        raise ValueError(f"malformed frame ({type(exc).__name__}: {exc})") from None


def read_frame(sock) -> tuple[dict, dict]:
    r"""Read one frame from a connected socket; ``ConnectionError`` if it closes early."""
    (size,) = struct.unpack("<Q", _read_exactly(sock, 8))
    return decode_frame(_read_exactly(sock, size))


def _read_exactly(sock, n: int) -> bytes:
    chunks, got = [], 0
    while got < n:
        chunk = sock.recv(min(n - got, 1 << 20))
        if not chunk:
            raise ConnectionError(f"the connection closed after {got} of {n} bytes")
        chunks.append(chunk)
        got += len(chunk)
    return b"".join(chunks)
