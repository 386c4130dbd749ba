r"""What a message's payload may hold, checked once for every transport (numpy only: a
Flower ``ClientApp`` imports it): a flat ``str -> value`` dict of numpy bool/int/float
arrays, bytes and scalars, what maps onto Flower's ``ArrayRecord`` and ``ConfigRecord``."""

from __future__ import annotations

import math

import numpy as np

SCALAR_TYPES = (bytes, int, float, str, bool, np.integer, np.floating, np.bool_)
#: the integers a message carries: Flower's records hold an int as sint64 or uint64
INT_RANGE = (-(2**63), 2**64 - 1)


def validate_payload(payload: dict) -> dict:
    r"""Check that ``payload`` is a flat ``str -> array | bytes | scalar`` dict; return it.

    Raises:
        TypeError: Naming the offending key and type (arrays must be bool, int or float).
        ValueError: A value no message can carry (naming its key): an int outside
            :data:`INT_RANGE`, a finite float beyond float64, or invalid Unicode text.
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
