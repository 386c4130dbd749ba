r"""Argument checks shared by :mod:`botorch_fed.privacy` (stdlib and torch only).

Every check names the argument and the offending value in its message: a wrong type
raises :class:`TypeError`, a value of the right type outside its domain raises
:class:`ValueError`.
"""

from __future__ import annotations

import math
import numbers
from typing import Any

import torch

__all__ = [
    "as_real",
    "check_count",
    "check_nonnegative_finite",
    "check_positive_finite",
    "check_probability",
    "check_user",
]


def as_real(name: str, value: Any) -> float:
    r"""Convert a real scalar (Python/NumPy number or one-element real tensor) to float.

    Args:
        name: Argument name used in the error message.
        value: The value to convert.

    Returns:
        ``float(value)`` (may be NaN or inf; the callers check the domain).

    Raises:
        TypeError: If ``value`` is a bool, not a real number, or a tensor that is not
            a one-element real tensor.
    """
    if isinstance(value, torch.Tensor):
        if value.numel() != 1 or value.dtype == torch.bool or value.is_complex():
            raise TypeError(
                f"{name} must be a real number, got a tensor of shape "
                f"{tuple(value.shape)} and dtype {value.dtype}"
            )
        return float(value.item())
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(
            f"{name} must be a real number, got {value!r} of type {type(value).__name__}"
        )
    return float(value)


def check_positive_finite(name: str, value: Any) -> float:
    r"""Return ``float(value)`` if it is a real number with ``0 < value < inf``.

    Raises:
        TypeError: If ``value`` is not a real number.
        ValueError: If ``value`` is NaN, infinite or ``<= 0``.
    """
    x = as_real(name, value)
    if not (math.isfinite(x) and x > 0.0):
        raise ValueError(f"{name} must be > 0 and finite, got {x!r}")
    return x


def check_nonnegative_finite(name: str, value: Any) -> float:
    r"""Return ``float(value)`` if it is a real number with ``0 <= value < inf``.

    Raises:
        TypeError: If ``value`` is not a real number.
        ValueError: If ``value`` is NaN, infinite or negative.
    """
    x = as_real(name, value)
    if not (math.isfinite(x) and x >= 0.0):
        raise ValueError(f"{name} must be >= 0 and finite, got {x!r}")
    return x


def check_probability(name: str, value: Any, *, allow_zero: bool) -> float:
    r"""Return ``float(value)`` if it lies in ``[0, 1)`` (``allow_zero``) or ``(0, 1)``.

    Raises:
        TypeError: If ``value`` is not a real number.
        ValueError: If ``value`` is NaN or outside the interval.
    """
    x = as_real(name, value)
    ok = (0.0 <= x < 1.0) if allow_zero else (0.0 < x < 1.0)
    if not ok:
        interval = "[0, 1)" if allow_zero else "(0, 1)"
        raise ValueError(f"{name} must be in {interval}, got {x!r}")
    return x


def check_count(name: str, value: Any, *, minimum: int, maximum: int | None = None) -> int:
    r"""Return ``int(value)`` if it is an integer in ``[minimum, maximum]``.

    Args:
        name: Argument name used in the error message.
        value: The value to check (Python or NumPy integer; bools are rejected).
        minimum: Smallest allowed value.
        maximum: Largest allowed value (``None``: no upper limit).

    Returns:
        ``int(value)``.

    Raises:
        TypeError: If ``value`` is not an integer (a float such as ``2.0`` included).
        ValueError: If ``value`` is outside ``[minimum, maximum]``.
    """
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be an integer, got {value!r} of type {type(value).__name__}")
    n = int(value)
    if n < minimum or (maximum is not None and n > maximum):
        hi = "" if maximum is None else f" and <= {maximum}"
        raise ValueError(f"{name} must be >= {minimum}{hi}, got {n}")
    return n


def check_user(user: Any) -> int | str | None:
    r"""Validate a user identifier: an ``int`` (NumPy integers converted), a ``str``
    or ``None``.

    Raises:
        TypeError: For any other type (bools included).
    """
    if user is None or isinstance(user, str):
        return user
    if isinstance(user, bool) or not isinstance(user, numbers.Integral):
        raise TypeError(
            f"user must be an int, a str or None, got {user!r} of type {type(user).__name__}"
        )
    return int(user)
