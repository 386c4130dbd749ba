r"""The protocol's :class:`Message`: a type and a flat payload of arrays, bytes and
scalars (one to one onto Flower's records); ``time:<stage>`` keys carry the client's
stage timings (seconds) for the ledger."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from botorch_fed.protocol.payloads import validate_payload

TIME_PREFIX = "time:"


@dataclass(frozen=True)
class Message:
    r"""One protocol message: its ``type`` (the client dispatches on it) and ``payload``."""

    type: str
    payload: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not isinstance(self.type, str) or not self.type:
            raise TypeError(f"Message type must be a non-empty str, got {self.type!r}.")
        validate_payload(self.payload)

    @property
    def nbytes(self) -> int:
        r"""Payload size: array/bytes/str contents, 8 per other scalar, plus the key names."""
        return sum(len(k) + _nbytes(v) for k, v in self.payload.items())

    def timings(self) -> dict[str, float]:
        r"""The ``time:<stage>`` entries, as ``{stage: seconds}``."""
        n = len(TIME_PREFIX)
        return {k[n:]: float(v) for k, v in self.payload.items() if k.startswith(TIME_PREFIX)}


def _nbytes(value: object) -> int:
    if isinstance(value, np.ndarray):
        return int(value.nbytes)
    if isinstance(value, bytes):
        return len(value)
    return len(value.encode()) if isinstance(value, str) else 8
