r"""Fixed-point encoding of float64 vectors into the ring of integers mod 2^64.

Masking-based secure aggregation (Bonawitz et al., "Practical Secure Aggregation for
Privacy-Preserving Machine Learning", CCS 2017) adds uniformly random masks in a
finite group; here that group is ``Z_{2^64}``, i.e. numpy ``uint64`` arithmetic with
its natural wrap-around. A real ``x`` is encoded as ``round(x * 2^f)`` (two's
complement, default ``f = 40``, a resolution of ``2^-40 ~ 9.1e-13``); the sum of ``n``
encodings decodes exactly as long as ``|sum| * 2^f < 2^63``, which the headroom bound
:func:`max_abs_supported` guarantees when every ``|x_i| <= max_abs_supported(n)``. The
rounding error of a decoded sum is at most ``n * 2^-(f+1)``.
"""

from __future__ import annotations

import numpy as np

from botorch_fed.secure.errors import HeadroomError

__all__ = [
    "DEFAULT_FRACTION_BITS",
    "decode",
    "encode",
    "max_abs_supported",
]

DEFAULT_FRACTION_BITS = 40
# Relative safety margin so that n * max_abs * 2^f plus n half-unit roundings stays
# strictly below 2^63 despite float64 rounding of the bound itself.
_MARGIN = 1.0 - 2.0**-30


def max_abs_supported(n_clients: int, fraction_bits: int = DEFAULT_FRACTION_BITS) -> float:
    """Largest ``max|x_i|`` for which the sum of ``n_clients`` encodings cannot wrap.

    Args:
        n_clients: Number of summed vectors (``>= 1``).
        fraction_bits: Fractional bits ``f`` of the encoding.

    Returns:
        ``2^(63 - f) / n_clients`` (times ``1 - 2^-30``).
    """
    if n_clients < 1:
        raise ValueError(f"n_clients must be >= 1, got {n_clients}")
    return 2.0 ** (63 - fraction_bits) / n_clients * _MARGIN


def encode(x: np.ndarray, n_clients: int, fraction_bits: int = DEFAULT_FRACTION_BITS) -> np.ndarray:
    """Encode a float64 vector as fixed point in ``Z_{2^64}``.

    Args:
        x: Finite float64 vector ``length``.
        n_clients: Number of vectors that will be summed (for the headroom check).
        fraction_bits: Fractional bits ``f``.

    Returns:
        ``round(x * 2^f) mod 2^64`` as uint64 ``length``.

    Raises:
        HeadroomError: If ``max|x| > max_abs_supported(n_clients, f)``.
    """
    x = np.asarray(x, dtype=np.float64)
    bound = max_abs_supported(n_clients, fraction_bits)
    peak = float(np.max(np.abs(x))) if x.size else 0.0
    if not peak <= bound:
        raise HeadroomError(
            f"max|x| = {peak:.6g} exceeds {bound:.6g} = 2^{63 - fraction_bits}/"
            f"{n_clients}: the fixed-point sum mod 2^64 would wrap around"
        )
    return np.rint(np.ldexp(x, fraction_bits)).astype(np.int64).view(np.uint64)


def decode(total: np.ndarray, fraction_bits: int = DEFAULT_FRACTION_BITS) -> np.ndarray:
    """Decode a sum of encodings (mod 2^64) back to float64.

    Args:
        total: uint64 vector ``length``, the sum mod 2^64 of encodings.
        fraction_bits: Fractional bits ``f`` used by :func:`encode`.

    Returns:
        float64 ``length``: the two's-complement value times ``2^-f``.
    """
    signed = np.asarray(total, dtype=np.uint64).view(np.int64)
    return np.ldexp(signed.astype(np.float64), -fraction_bits)
