r"""How far a backend's sum may lie from an independent numpy float64 sum, derived from
the backend's encoding and the float64 roundings of the two sides (not a test module).

A comparison ``|backend sum - plain_sum|`` (:func:`tests.helpers.secure_roles.plain_sum`)
carries the errors of both sides, coordinate by coordinate, with ``u = eps / 2`` and
``A = sum_i |x_i|`` over the ``M`` summed vectors:

- the reference: numpy adds the ``M`` rows one after another in float64, within
  ``gamma_{M-1} A ~ (M - 1) u A`` of the exact sum (Higham, *Accuracy and Stability of
  Numerical Algorithms*, Thm. 3.5);
- ``plaintext``: the server's float64 sum of the same vectors, in its own order: the
  same bound; the two sides are two float64 evaluations of one sum, within
  ``reordering_factor(M) * eps * A`` (``tests/helpers/tolerances.py``);
- ``masking``: each input rounded to the fixed-point grid ``2^-f``, at most
  ``2^-(f+1)`` each (:mod:`botorch_fed.secure.fixed_point`), the integer sum exact mod
  ``2^64`` and converted to float64 once (``u |sum| <= u A``): within
  ``M 2^-(f+1) + u A`` of the exact sum; with the reference ``M 2^-(f+1) + M u A``.

CKKS sums carry encryption noise, which is not rounding: the tests that compare them
keep their own (measured, statistical) bounds.
"""

from __future__ import annotations

import numpy as np

from botorch_fed.secure.fixed_point import DEFAULT_FRACTION_BITS
from tests.helpers.tolerances import reordering_factor

EPS = float(np.finfo(np.float64).eps)


def sum_bound(
    name: str,
    inputs: dict[int, np.ndarray],
    ids=None,
    fraction_bits: int = DEFAULT_FRACTION_BITS,
) -> np.ndarray:
    r"""Per-coordinate bound on ``|backend sum - plain_sum(inputs, ids)|``.

    Args:
        name: ``"plaintext"`` or ``"masking"``.
        inputs: The clients' vectors.
        ids: The contributors (default: all of ``inputs``).
        fraction_bits: The masking backend's fixed-point fractional bits.

    Returns:
        The bound, shaped like one input.
    """
    ids = sorted(inputs) if ids is None else sorted(ids)
    M = len(ids)
    A = np.sum([np.abs(np.asarray(inputs[i], dtype=np.float64)) for i in ids], axis=0)
    if name == "plaintext":
        return reordering_factor(M) * EPS * A
    if name == "masking":
        return M * 2.0 ** -(fraction_bits + 1) + M * (EPS / 2) * A
    raise ValueError(f"no rounding bound for the {name!r} backend (CKKS adds noise)")


def assert_sum_close(
    total: np.ndarray, expected: np.ndarray, name: str, inputs, ids=None, **kwargs
) -> None:
    r"""``|total - expected| <= sum_bound(name, inputs, ids)`` at every coordinate."""
    bound = sum_bound(name, inputs, ids, **kwargs)
    err = np.abs(np.asarray(total, dtype=np.float64) - expected)
    bad = ~(err <= bound)  # NaN fails
    if bad.any():
        i = int(np.argmax(np.where(bad, err / np.maximum(bound, 1e-300), -1.0)))
        raise AssertionError(
            f"{name} sum: {int(bad.sum())} of {err.size} coordinates off by more than the "
            f"derived bound; worst: error {err.flat[i]:.3e} vs bound {bound.flat[i]:.3e}"
        )
