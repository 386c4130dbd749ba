r"""The secure-sum sub-protocol's messages and what both roles share.

A secure sum is a session of a ``botorch_fed.secure`` backend whose bytes the server
relays (:meth:`~botorch_fed.protocol.server.FederatedServer.secure_sum`): its opening
:class:`SecureSumStep` names the ``request`` (a vector the client contributes,
declared with :func:`~botorch_fed.protocol.declarations.contributes`), the encoding
``wide`` and the ``round``; :class:`SecureSumResult` closes it. Vectors travel in the
exact limb encoding (:func:`limb_encoding`) unless the client sends raw floats for a
request. :func:`relayed_digest` chains what the server told a client into the next
session, so that a server that equivocates gets no sum.
"""

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
#: the largest frame of a secure-sum step a client accepts (CKKS ciphertexts of the
#: largest summaries are a few MB)
MAX_FRAME_BYTES = 1 << 28


@dataclasses.dataclass(frozen=True)
class Arguments(Domain):
    r"""A secure-sum request's arguments: checked by the request's own declaration
    (:func:`~botorch_fed.protocol.declarations.contributes`) once the request is known
    (:meth:`FederatedClient.on_secagg`); here only that they came with a request."""

    def check(self, value: object, party: object) -> dict:
        if not isinstance(value, Mapping):  # only decode() puts them here
            raise FieldError("must be a mapping of the `arg:<name>` fields")
        return dict(value)


def limb_encoding(high: int) -> LimbEncoding:
    r"""The limb encoding for values below ``2^high`` (resolution ``2^-40``)."""
    return LimbEncoding(bits=12, low=-40, high=int(high))


@declare(SECAGG)
class SecureSumStep(Declared):
    r"""One step of a secure-sum session. The opening step names the ``request`` (one
    the client contributes to), the encoding ``wide`` and the ``round``; its arguments
    travel as ``arg:<name>`` fields, checked against the request's declaration
    (:func:`~botorch_fed.protocol.declarations.contributes`)."""

    data: Annotated[bytes, Blob(MAX_FRAME_BYTES)]
    request: Annotated[str | None, Choice(lambda c: c.sum_requests(), optional=True)]
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
    r"""The sum a server forwards: checked by the session it ends
    (:meth:`~botorch_fed.protocol.client.FederatedClient.on_secagg_result`: its length,
    its decoding, its agreement with the client's own decryption), which names the
    session's request and closes the session whatever the outcome."""

    def check(self, value: object, party: object) -> object:
        return value


@declare(SUM_RESULT)
class SecureSumResult(Declared):
    r"""The end of a secure-sum session: the sum, if the server learnt it."""

    sum: Annotated[np.ndarray | None, ForwardedSum(optional=True)]


def relayed_digest(previous: bytes, type: str, payload: Mapping) -> bytes:
    r"""``previous`` chained with one relayed message (SHA-256 of a canonical encoding).

    The encoding is exact and unambiguous: keys sorted; each value tagged with its kind
    (bool, int, float, str, bytes, array), arrays with their kind, shape and values as
    little-endian int64 / float64 / bool bytes, so two payloads get the same digest iff
    they hold the same values.

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
