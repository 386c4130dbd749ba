r"""Typed messages of the federation protocol.

A round is the server sending each selected client a :class:`Message` and the client
answering with one. Payloads are flat dicts whose values are numpy arrays, bytes or
scalars (``int``, ``float``, ``str``, ``bool``), so they map one to one onto Flower's
``ArrayRecord`` (arrays) and ``ConfigRecord`` (bytes and scalars). Keys starting
with ``time:`` carry the client's own stage timings (seconds) for the ledger.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from botorch_fed.protocol.payloads import PayloadValue, validate_payload

TIME_PREFIX = "time:"


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
