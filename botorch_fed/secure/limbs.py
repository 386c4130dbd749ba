r"""Wide-range encoding of float64 vectors for secure sums ("limbs").

The masking backend sums fixed-point numbers (resolution ``2^-40``, mod ``2^64``) and
CKKS sums approximate numbers whose absolute error grows with the largest slot, so
both want inputs of moderate magnitude. Federated statistics are not always that
way (outcome moments of unscaled objectives reach ``1e10``; dPITC summaries grow
like ``n / noise``). :class:`LimbEncoding` writes each value as a balanced base-``2^b``
number with small integer digits (limbs),

    x ~= sum_k d_k 2^(low + b k),   d_k in [-2^(b-1), 2^(b-1)],

so every limb has magnitude ``<= 2^(b-1)``, and sums limb-wise: the sum of the
encodings is an encoding of the sum (with carries left unpropagated), which
:meth:`LimbEncoding.decode` turns back into float64. Limb sums are integers, so an
approximate (CKKS) sum is rounded back to the exact one. Values are rounded to a
multiple of ``2^low`` (absolute error ``<= 2^(low-1)``) and must stay below
``2^(low + b K - 1)`` in magnitude, ``K`` the number of limbs.
"""

from __future__ import annotations

import numpy as np


class LimbEncoding:
    r"""Balanced base-``2^bits`` digits covering ``[2^low, 2^high)``.

    Args:
        bits: Bits per limb (digits in ``[-2^(bits-1), 2^(bits-1)]``).
        low: Exponent of the least significant limb (resolution ``2^low``).
        high: Exponent above which values are rejected.
    """

    def __init__(self, bits: int = 12, low: int = -40, high: int = 64) -> None:
        if not (isinstance(bits, int) and 2 <= bits <= 24):
            raise ValueError(f"`bits` must be an int in [2, 24], got {bits!r}.")
        if not (isinstance(low, int) and isinstance(high, int) and high > low):
            raise ValueError(f"`low` < `high` must be ints, got low={low!r}, high={high!r}.")
        self.bits = bits
        self.low = low
        self.num_limbs = -(-(high - low) // bits) + 1  # one spare limb for the sign/carry
        self.high = high

    def max_limb(self) -> int:
        r"""Largest limb magnitude of one encoded vector."""
        return 1 << (self.bits - 1)

    def encoded_length(self, length: int) -> int:
        r"""Length of the encoding of a ``length`` vector."""
        return length * self.num_limbs

    def encode(self, x: np.ndarray) -> np.ndarray:
        r"""Encode a float64 vector into its limbs.

        Args:
            x: ``length`` finite values with ``|x| < 2^high``.

        Returns:
            ``length * num_limbs`` float64 integers (limb-major per value).
        """
        x = np.asarray(x, dtype=np.float64).reshape(-1)
        if not np.isfinite(x).all():
            raise ValueError("Cannot encode NaN or infinite values.")
        if x.size and np.abs(x).max() >= 2.0**self.high:
            raise ValueError(
                f"max|x| = {np.abs(x).max():.3g} exceeds the encoding range 2^{self.high}."
            )
        # v = x / 2^low rounded to an integer; every step below is exact in float64
        # (power-of-two scalings, rounding of representable values, and differences of
        # nearby integers), so no Python-level big integers are needed.
        base = float(1 << self.bits)
        v: np.ndarray = np.round(np.ldexp(x, -self.low))
        out = np.empty((x.size, self.num_limbs))
        for k in range(self.num_limbs):
            d = v - base * np.round(v / base)  # balanced digit in [-base/2, base/2]
            out[:, k] = d
            v = (v - d) / base
        if np.any(v != 0):  # cannot happen within range (guarded above)
            raise ValueError("a value does not fit into the limbs.")
        return out.reshape(-1)

    def decode(self, limbs: np.ndarray) -> np.ndarray:
        r"""Decode a (summed) limb vector into float64 values.

        Args:
            limbs: ``length * num_limbs`` values (sums of encodings). Limb sums are
                integers; an approximate sum (CKKS) is rounded to them, which removes
                its error (it must be below 1/4).

        Returns:
            The ``length`` decoded values.
        """
        limbs = np.asarray(limbs, dtype=np.float64)
        if limbs.ndim != 1 or limbs.size % self.num_limbs:
            raise ValueError(
                f"A limb vector has a multiple of {self.num_limbs} entries, got shape "
                f"{limbs.shape}."
            )
        digits = np.round(limbs)
        off = np.abs(limbs - digits).max(initial=0.0)
        if off > 0.25:
            raise ValueError(
                f"Summed limbs are {off:.3g} away from integers: the sum is corrupted or "
                "its approximation error exceeds what the encoding tolerates."
            )
        digits = digits.reshape(-1, self.num_limbs)
        weights = np.ldexp(1.0, self.low + self.bits * np.arange(self.num_limbs))
        # sum the small limbs first for accuracy
        return (digits * weights).sum(axis=1)
