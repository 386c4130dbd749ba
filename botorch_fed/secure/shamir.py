r"""Shamir secret sharing of short byte strings over the prime field ``GF(2^521 - 1)``.

Shamir, "How to share a secret", CACM 1979. A secret of at most 64 bytes is read as
an integer ``s < 2^512 < p = 2^521 - 1`` (a Mersenne prime), a random polynomial
``f`` of degree ``t - 1`` with ``f(0) = s`` is drawn, and client ``x`` receives
``f(x)``. Any ``t`` shares determine ``s`` by Lagrange interpolation at 0; fewer
reveal nothing about it. Used by the masking backend (Bonawitz et al., CCS 2017) to
share each client's pairwise X25519 private key and self-mask seed, so that the
aggregate survives dropouts down to the threshold ``t``.

Interpolation with a wrong or altered share yields a wrong secret without any error,
so callers must check the reconstructed secret against a commitment (the masking
backend compares it with the advertised public key or a SHA-256 commitment).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from botorch_fed.secure.errors import TamperedMessageError

__all__ = [
    "PRIME",
    "SHARE_SIZE",
    "lagrange_at_zero",
    "reconstruct",
    "share_from_bytes",
    "share_to_bytes",
    "split",
]

PRIME = 2**521 - 1
SHARE_SIZE = 66  # bytes of a field element
_MAX_SECRET_BYTES = 64
_COEFF_BYTES = 80  # 640 random bits per coefficient: bias mod p below 2^-119


def split(
    secret: bytes,
    xs: Sequence[int],
    threshold: int,
    randbytes: Callable[[int], bytes],
) -> dict[int, int]:
    """Split ``secret`` into shares ``f(x)`` for each ``x`` in ``xs``.

    Args:
        secret: At most 64 bytes.
        xs: Distinct non-zero evaluation points (e.g. ``client_id + 1``).
        threshold: Number of shares ``t`` needed to reconstruct (``1 <= t <= len(xs)``).
        randbytes: Source of random bytes for the coefficients.

    Returns:
        ``{x: f(x)}``.
    """
    if len(secret) > _MAX_SECRET_BYTES:
        raise ValueError(f"secret must be at most {_MAX_SECRET_BYTES} bytes")
    if not 1 <= threshold <= len(xs):
        raise ValueError(f"threshold must be in [1, {len(xs)}], got {threshold}")
    if len(set(xs)) != len(xs) or any(not 0 < x < PRIME for x in xs):
        raise ValueError("evaluation points must be distinct and in (0, p)")
    coeffs = [int.from_bytes(secret, "big")] + [
        int.from_bytes(randbytes(_COEFF_BYTES), "big") % PRIME for _ in range(threshold - 1)
    ]
    shares = {}
    for x in xs:
        acc = 0
        for c in reversed(coeffs):  # Horner
            acc = (acc * x + c) % PRIME
        shares[x] = acc
    return shares


def lagrange_at_zero(xs: Sequence[int]) -> list[int]:
    """Lagrange basis coefficients ``l_i(0)`` for the points ``xs`` (mod p).

    With ``lam = lagrange_at_zero(xs)``, ``f(0) = sum_i lam[i] * f(xs[i])`` for every
    polynomial of degree below ``len(xs)``; computing ``lam`` once lets many secrets
    shared at the same points be reconstructed in ``O(t)`` each.

    Args:
        xs: Distinct non-zero points.

    Returns:
        One coefficient per point, same order.
    """
    out = []
    for i, xi in enumerate(xs):
        num, den = 1, 1
        for j, xj in enumerate(xs):
            if i != j:
                num = num * xj % PRIME
                den = den * (xj - xi) % PRIME
        out.append(num * pow(den, -1, PRIME) % PRIME)
    return out


def reconstruct(
    shares: Mapping[int, int], size: int, coefficients: Sequence[int] | None = None
) -> bytes:
    """Reconstruct a secret of ``size`` bytes from exactly ``t`` shares.

    Args:
        shares: ``{x: f(x)}`` with ``t`` entries (ordered like ``coefficients``).
        size: Length of the secret in bytes.
        coefficients: Precomputed :func:`lagrange_at_zero` for ``list(shares)``.

    Returns:
        The secret.

    Raises:
        TamperedMessageError: If the interpolated value does not fit in ``size``
            bytes (inconsistent shares).
    """
    xs = list(shares)
    lam = lagrange_at_zero(xs) if coefficients is None else coefficients
    value = sum(c * shares[x] for c, x in zip(lam, xs, strict=True)) % PRIME
    if value >= 1 << (8 * size):
        raise TamperedMessageError("inconsistent secret shares (reconstruction out of range)")
    return value.to_bytes(size, "big")


def share_to_bytes(value: int) -> bytes:
    """Serialise a share value (``SHARE_SIZE`` bytes, big endian)."""
    return value.to_bytes(SHARE_SIZE, "big")


def share_from_bytes(data: bytes) -> int:
    """Parse a share value.

    Raises:
        TamperedMessageError: Wrong size or not a field element.
    """
    if len(data) != SHARE_SIZE:
        raise TamperedMessageError(f"a share is {SHARE_SIZE} bytes, got {len(data)}")
    value = int.from_bytes(data, "big")
    if value >= PRIME:
        raise TamperedMessageError("share is not a field element")
    return value
