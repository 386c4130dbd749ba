r"""Typed messages of the federation protocol.

A round is the server sending each selected client a :class:`Message` and the client
answering with one. Payloads are flat dicts whose values are numpy arrays, bytes or
scalars (``int``, ``float``, ``str``, ``bool``), so they map one to one onto Flower's
``ArrayRecord`` (arrays) and ``ConfigRecord`` (bytes and scalars). Keys starting
with ``time:`` carry the client's own stage timings (seconds) for the ledger.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

PayloadValue = np.ndarray | bytes | int | float | str | bool
SCALAR_TYPES = (bytes, int, float, str, bool, np.integer, np.floating, np.bool_)
TIME_PREFIX = "time:"
#: the integers a message carries: Flower's records hold an int as sint64 or uint64
INT_RANGE = (-(2**63), 2**64 - 1)


def validate_payload(payload: dict) -> dict:
    r"""Check that a payload is a flat ``str -> array | bytes | scalar`` dict.

    Args:
        payload: The payload.

    Returns:
        The payload, unchanged.

    Raises:
        TypeError: Naming the offending key and type (arrays must be bool, int or
            float).
        ValueError: A value no message can carry (naming its key): an int outside
            :data:`INT_RANGE`, a finite float beyond float64, or a key or str that is
            not valid Unicode text.
    """
    if not isinstance(payload, dict):
        raise TypeError(f"A payload must be a dict, got {type(payload).__name__}.")
    for key, value in payload.items():
        if not isinstance(key, str):
            raise TypeError(f"Payload keys must be str, got {key!r}.")
        _check_text(f"Payload key {key!r}", key)
        if isinstance(value, np.ndarray):
            if value.dtype.kind not in "biuf":  # what Flower's ArrayRecord carries
                raise TypeError(
                    f"Payload entry {key!r} is a {value.dtype} array; use bool, int or "
                    "float arrays."
                )
        elif not isinstance(value, SCALAR_TYPES):
            raise TypeError(
                f"Payload entry {key!r} has type {type(value).__name__}; allowed are numpy "
                "arrays, bytes, int, float, str and bool."
            )
        elif isinstance(value, int | np.integer) and not isinstance(value, bool):
            if not INT_RANGE[0] <= int(value) <= INT_RANGE[1]:
                raise ValueError(
                    f"Payload entry {key!r} = {int(value)} is outside [-2**63, 2**64 - 1], "
                    "the integers a message carries; send it as bytes."
                )
        elif isinstance(value, str):
            _check_text(f"Payload entry {key!r}", value)
        elif isinstance(value, np.floating) and np.isfinite(value):
            if not math.isfinite(float(value)):
                raise ValueError(
                    f"Payload entry {key!r} = {value!s} is beyond float64, the floats a "
                    "message carries."
                )
    return payload


def _check_text(what: str, text: str) -> None:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise ValueError(f"{what} is not valid Unicode text ({exc.reason}).") from None


def _nbytes(value: PayloadValue) -> int:
    if isinstance(value, np.ndarray):
        return int(value.nbytes)
    if isinstance(value, bytes):
        return len(value)
    if isinstance(value, str):
        return len(value.encode())
    return 8


@dataclass(frozen=True)
class Message:
    r"""One protocol message.

    Attributes:
        type: What the message asks for / answers (the client dispatches on it).
        payload: Flat dict of arrays, bytes and scalars.
    """

    type: str
    payload: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not isinstance(self.type, str) or not self.type:
            raise TypeError(f"Message type must be a non-empty str, got {self.type!r}.")
        validate_payload(self.payload)

    @property
    def nbytes(self) -> int:
        r"""Payload size in bytes: array/bytes/str contents plus 8 per scalar and the
        key names (what a compact serialisation such as Flower's records costs)."""
        return sum(len(k) + _nbytes(v) for k, v in self.payload.items())

    def timings(self) -> dict[str, float]:
        r"""The ``time:<stage>`` entries, as ``{stage: seconds}``."""
        return {
            k[len(TIME_PREFIX) :]: float(v)
            for k, v in self.payload.items()
            if k.startswith(TIME_PREFIX)
        }
