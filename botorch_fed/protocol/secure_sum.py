r"""The secure-sum sub-protocol's messages (:class:`SecureSumStep`, :class:`SecureSumResult`)
and :func:`relayed_digest`, which binds what the server told a client into the next session."""

from __future__ import annotations

import dataclasses
import hashlib
import struct
from collections.abc import Mapping
from typing import Annotated, Self

import numpy as np

from botorch_fed.protocol.declarations import (
    Blob,
    Choice,
    Declared,
    Domain,
    FieldError,
    Int,
    Refused,
    declare,
)
from botorch_fed.protocol.payloads import INT_RANGE
from botorch_fed.secure.limbs import LimbEncoding

SECAGG = "secagg"
SUM_RESULT = "secagg_result"
ARG_PREFIX = "arg:"
MAX_FRAME_BYTES = 1 << 28


@dataclasses.dataclass(frozen=True)
class Arguments(Domain):
    r"""A request's arguments: checked by the request's own declaration once it is known."""

    def check(self, value: object, party: object) -> dict:
        if not isinstance(value, Mapping):  # only decode() puts them here
            raise FieldError("must be a mapping of the `arg:<name>` fields")
        return dict(value)


def limb_encoding(high: int) -> LimbEncoding:
    r"""The limb encoding for values below ``2^high`` (resolution ``2^-40``)."""
    return LimbEncoding(bits=12, low=-40, high=int(high))


@declare(SECAGG)
class SecureSumStep(Declared):
    r"""One step of a secure-sum session; the opening one names ``request``, ``wide`` and
    ``round``, with the request's arguments as ``arg:<name>`` fields."""

    data: Annotated[bytes, Blob(MAX_FRAME_BYTES)]
    request: Annotated[str | None, Choice("CONTRIBUTIONS", optional=True)]
    wide: Annotated[int | None, Int(0, 64, optional=True)]
    round: Annotated[int | None, Int(0, INT_RANGE[1], optional=True)]
    args: Annotated[dict | None, Arguments(optional=True)]

    @classmethod
    def decode(cls, payload: Mapping[str, object], party: object) -> Self:
        if "args" in payload:  # the arguments travel as `arg:<name>` fields only
            raise Refused("args", "is not a field of this message (arguments travel as arg:<name>)")
        args = {k[len(ARG_PREFIX) :]: v for k, v in payload.items() if k.startswith(ARG_PREFIX)}
        rest = {k: v for k, v in payload.items() if not k.startswith(ARG_PREFIX)}
        if args:
            rest["args"] = args
        return super().decode(rest, party)

    def wire(self) -> dict:
        payload = self.payload()
        args = payload.pop("args", None) or {}
        return {**payload, **{f"{ARG_PREFIX}{k}": v for k, v in args.items()}}


@dataclasses.dataclass(frozen=True)
class ForwardedSum(Domain):
    r"""The sum a server forwards: checked by the session it ends (``on_secagg_result``)."""

    def check(self, value: object, party: object) -> object:
        return value


@declare(SUM_RESULT)
class SecureSumResult(Declared):
    r"""The end of a secure-sum session: the sum, if the server learnt it."""

    sum: Annotated[np.ndarray | None, ForwardedSum(optional=True)]


def relayed_digest(previous: bytes, type: str, payload: Mapping) -> bytes:
    r"""``previous`` chained with one relayed message: SHA-256 of an exact, unambiguous
    encoding (keys sorted, values tagged with their kind; arrays with kind and shape).

    Raises:
        TypeError: A value that is not a payload value (naming its key).
    """
    h = hashlib.sha256(b"botorch-fed/relayed\x00" + previous)
    h.update(_field(type.encode()))
    for key in sorted(payload):
        h.update(_field(key.encode()) + _value(key, payload[key]))
    return h.digest()


def _field(data: bytes) -> bytes:
    return struct.pack("<Q", len(data)) + data


def _value(key: str, value: object) -> bytes:
    if isinstance(value, bool | np.bool_):
        return b"b" + _field(b"\x01" if value else b"\x00")
    if isinstance(value, int | np.integer):
        return b"i" + _field(str(int(value)).encode())
    if isinstance(value, float | np.floating):
        return b"f" + _field(struct.pack("<d", float(value)))
    if isinstance(value, str):
        return b"s" + _field(value.encode())
    if isinstance(value, bytes):
        return b"y" + _field(value)
    if isinstance(value, np.ndarray) and value.dtype.kind in "biuf":
        kind = {"b": "?", "i": "<i8", "u": "<i8", "f": "<f8"}[value.dtype.kind]
        if value.dtype.kind == "u" and value.size and value.max() >= 2**63:
            kind = "<u8"
        data = np.ascontiguousarray(value, dtype=kind).tobytes()
        shape = struct.pack(f"<{value.ndim}Q", *value.shape)
        return b"a" + _field(kind.encode()) + _field(shape) + _field(data)
    raise TypeError(f"Payload entry {key!r} of type {type(value).__name__} cannot be relayed.")
