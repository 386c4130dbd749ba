r"""Outcome standardisation with federation-wide moments, exact for any float64 data.

BoTorch models standardise outcomes with the mean and standard deviation of the
training data. In a federation nobody holds all outcomes, but both follow from sums
over clients: the count ``n``, ``sum y`` and ``sum y^2``. Each client sends its three
sums (through secure aggregation when required) and every party builds the same
trained ``Standardize`` transform from the total.

Computing the variance from these sums in floating point, ``(sum y^2 - n mean^2) /
(n - 1)``, cancels catastrophically when the offset is large compared with the
spread (``y = 1e8 + N(0, 1)``: about 16 of float64's 16 digits cancel), and the raw
sums exceed the headroom of secure aggregation early (``sum y^2`` of ``|y| ~ 1e3``).
So the sums are not sent as floats. Every finite float64 is an integer multiple of
``2^-1074``; :func:`outcome_moments` computes, with Python integers, the *exact*
integers

    N = n,    S1 = sum_j y_j 2^1126,    S2 = sum_j y_j^2 2^2252

(``2^1126 = 2^(1074 + 52)`` keeps every term an integer, subnormals included) and
writes each as balanced base-``2^12`` digits ("limbs", ``|digit| <= 2^11``), a vector
of :data:`OUTCOME_MOMENTS_LENGTH` small integers. Summing such vectors limb by limb
(with any aggregator: plain ``sum``, the ``plaintext``, ``ckks`` or ``masking``
backend, with or without the wide limb encoding of ``botorch_fed.secure``) gives
limb sums of magnitude ``<= M 2^11`` for ``M`` clients -- far inside every backend's
headroom, exact in float64 and exact after rounding a CKKS sum -- from which
:func:`standardize_from_moments` recovers the exact ``N, S1, S2`` and evaluates

    mean = S1 / (N 2^1126),    var = (N S2 - S1^2) / (N (N - 1) 2^2252)

in exact rational arithmetic: the mean is the correctly rounded float64 mean of all
outcomes and the standard deviation is within one unit in the last place of the exact
sample standard deviation, for any finite float64 outcomes (``|y|`` up to
``1.8e308``, offsets and spreads of any size). The price is the vector length: 552
numbers instead of 3 (in FBO-FedGP still one CKKS ciphertext; about 4.4 kB per client
with masking), and about a millisecond of integer arithmetic per client.

What a party that sees the sum learns is the exact ``n``, ``sum y`` and ``sum y^2`` of
all outcomes (the mean and variance it is meant to compute) plus the limb sums'
carry pattern, see ``docs/security.md``.
"""

from __future__ import annotations

import math

import numpy as np
import torch
from botorch.exceptions.errors import BotorchTensorDimensionError, InputDataError
from botorch.models.transforms.outcome import Standardize
from torch import Tensor

LIMB_BITS = 12
# every finite float64 times 2^GRID_EXP is an integer (frexp exponents are >= -1073)
GRID_EXP = 1126
# limbs of N (< 2^53), S1 (< 2^53 * 2^1024 * 2^1126) and S2 (< 2^53 * 2^2048 * 2^2252);
# K balanced limbs hold |v| < 2^(12 K - 1)
_NUM_LIMBS = (5, 184, 363)
OUTCOME_MOMENTS_LENGTH = sum(_NUM_LIMBS)
_MAX_COUNT = 2**53


def _to_limbs(value: int, num_limbs: int) -> list[int]:
    r"""Balanced base-``2^LIMB_BITS`` digits of an integer, least significant first."""
    base, half, mask = 1 << LIMB_BITS, 1 << (LIMB_BITS - 1), (1 << LIMB_BITS) - 1
    digits = []
    for _ in range(num_limbs):
        d = value & mask  # value mod base, also for negative values
        if d > half:
            d -= base
        digits.append(d)
        value = (value - d) >> LIMB_BITS
    if value != 0:  # cannot happen within the documented ranges
        raise ValueError("An outcome moment does not fit into its limbs.")
    return digits


def _from_limbs(digits: np.ndarray) -> int:
    r"""The integer ``sum_k digits[k] 2^(LIMB_BITS k)`` (digits: summed limbs)."""
    value = 0
    for d in reversed(digits.tolist()):
        value = (value << LIMB_BITS) + int(d)
    return value


def outcome_moments(train_Y: Tensor) -> np.ndarray:
    r"""A client's outcome moments ``[n, sum y, sum y^2]``, exactly encoded for summing.

    The three sums are computed exactly (integer arithmetic) and written as small
    integer limbs (see the module docstring), so that the sum of the clients'
    vectors -- by any aggregator -- determines the federation's ``n``, ``sum y`` and
    ``sum y^2`` exactly. Decode the sum with :func:`standardize_from_moments` or
    :func:`outcome_statistics`.

    Args:
        train_Y: ``n x 1`` local outcomes (any floating dtype; ``n = 0`` contributes
            nothing).

    Returns:
        A float64 array of :data:`OUTCOME_MOMENTS_LENGTH` integers in
        ``(-2048, 2048]``, to be summed across clients.
    """
    if not isinstance(train_Y, Tensor):
        raise TypeError(f"`train_Y` must be a Tensor, got {type(train_Y).__name__}.")
    if train_Y.ndim != 2 or train_Y.shape[-1] != 1:
        raise BotorchTensorDimensionError(
            f"`train_Y` must be `n x 1`, got shape {tuple(train_Y.shape)}."
        )
    if train_Y.is_complex():
        raise InputDataError(f"`train_Y` must be real, got dtype {train_Y.dtype}.")
    y = train_Y.detach().to(device="cpu", dtype=torch.float64).reshape(-1).numpy()
    if not np.isfinite(y).all():
        raise InputDataError(
            f"`train_Y` contains {int((~np.isfinite(y)).sum())} NaN or infinite values."
        )
    n = y.size
    if n >= _MAX_COUNT:
        raise InputDataError(f"`train_Y` has {n} outcomes; at most 2^53 - 1 are supported.")
    # y = M 2^(e - 53) with integer M (|M| < 2^53), so y 2^GRID_EXP = M 2^(e + 1073)
    mant, expo = np.frexp(y)
    M = np.ldexp(mant, 53).astype(np.int64)
    shift = expo.astype(np.int64) + (GRID_EXP - 53)
    s1 = s2 = 0
    # one big-integer shift per distinct exponent (values of one magnitude share it)
    order = np.argsort(shift, kind="stable")
    shifts, starts = np.unique(shift[order], return_index=True)
    groups = np.split(M[order], starts[1:]) if n else []
    for sh, group in zip(shifts.tolist(), groups, strict=True):
        ms = group.tolist()
        s1 += sum(ms) << sh
        s2 += sum(m * m for m in ms) << (2 * sh)
    limbs = []
    for value, k in zip((n, s1, s2), _NUM_LIMBS, strict=True):
        limbs.extend(_to_limbs(value, k))
    return np.array(limbs, dtype=np.float64)


def _decode(moments: np.ndarray | Tensor) -> tuple[int, int, int]:
    r"""The exact ``(N, S1, S2)`` of a sum of :func:`outcome_moments` vectors."""
    if isinstance(moments, Tensor):
        moments = moments.detach().cpu().numpy()
    moments = np.asarray(moments, dtype=np.float64)
    if moments.shape != (OUTCOME_MOMENTS_LENGTH,):
        hint = (
            " (a plain [n, sum y, sum y^2] vector is no longer accepted: sum the vectors "
            "of `outcome_moments`, which encode these sums exactly)"
            if moments.size == 3
            else ""
        )
        raise ValueError(
            f"`moments` must be the sum of `outcome_moments` vectors, shape "
            f"({OUTCOME_MOMENTS_LENGTH},), got shape {moments.shape}{hint}."
        )
    if not np.isfinite(moments).all():
        raise ValueError(
            f"`moments` contains {int((~np.isfinite(moments)).sum())} NaN or infinite values."
        )
    digits = np.round(moments)
    off = float(np.abs(moments - digits).max())
    if off > 0.25:
        raise ValueError(
            f"`moments` entries must be sums of integer limbs, but one is {off:.3g} away from "
            "an integer: the sum is corrupted or its approximation error is too large."
        )
    if np.abs(digits).max() >= 2.0**53:
        raise ValueError("`moments` has limb sums beyond 2^53: not a sum of client moments.")
    a, b = _NUM_LIMBS[0], _NUM_LIMBS[0] + _NUM_LIMBS[1]
    n, s1, s2 = _from_limbs(digits[:a]), _from_limbs(digits[a:b]), _from_limbs(digits[b:])
    if n < 1:
        raise ValueError(f"`moments` reports n={n} observations; need at least 1.")
    if n * s2 < s1 * s1:  # Cauchy-Schwarz holds exactly for honest sums
        raise ValueError("`moments` is inconsistent (n sum y^2 < (sum y)^2): the sum is corrupted.")
    return n, s1, s2


def _sqrt_ratio(num: int, den: int, exp: int) -> float:
    r"""``sqrt(num / den) * 2^exp`` for integers ``num >= 0``, ``den > 0``, to ~1 ulp."""
    if num == 0:
        return 0.0
    # t = floor(num 2^(2s) / den) has >= 128 bits, so r = isqrt(t) has >= 64
    s = max(0, (130 - (num.bit_length() - den.bit_length())) // 2 + 1)
    r = math.isqrt((num << (2 * s)) // den)
    extra = max(0, r.bit_length() - 64)
    return math.ldexp(float(r >> extra), extra - s + exp)


def outcome_statistics(moments: np.ndarray | Tensor) -> tuple[int, float, float]:
    r"""Count, mean and sample standard deviation of all clients' outcomes.

    Args:
        moments: The sum over clients of :func:`outcome_moments` (length
            :data:`OUTCOME_MOMENTS_LENGTH`).

    Returns:
        ``(n, mean, std)``: the number of outcomes, their correctly rounded float64
        mean and their unbiased standard deviation (``torch.std``'s; within one unit
        in the last place; ``nan`` for ``n = 1``).

    Raises:
        ValueError: ``moments`` has the wrong shape, is not finite, is not a sum of
            integer limbs, reports ``n < 1`` or is inconsistent; or the standard
            deviation overflows float64.
    """
    n, s1, s2 = _decode(moments)
    try:
        mean = s1 / (n << GRID_EXP)  # int / int: correctly rounded
        std = math.nan if n == 1 else _sqrt_ratio(n * s2 - s1 * s1, n * (n - 1), -GRID_EXP)
    except OverflowError:
        raise ValueError(
            "The mean or standard deviation described by `moments` overflows float64."
        ) from None
    return n, mean, std


def standardize_from_moments(
    moments: np.ndarray | Tensor,
    dtype: torch.dtype = torch.float64,
    device: torch.device | str | None = None,
    min_stdv: float = 1e-8,
) -> Standardize:
    r"""A trained, eval-mode ``Standardize(m=1)`` from summed outcome moments.

    Equals ``Standardize(m=1, min_stdv=min_stdv)`` trained on all clients' outcomes
    pooled (computed in float64, then cast to ``dtype``): the mean is correctly
    rounded, the standard deviation exact to about one unit in the last place; one
    observation, or a standard deviation below ``min_stdv``, gives standard
    deviation 1, as in BoTorch.

    Args:
        moments: The sum over clients of :func:`outcome_moments`.
        dtype: dtype of the transform's buffers.
        device: device of the transform's buffers.
        min_stdv: Standard deviations below this are replaced by 1 (as BoTorch).

    Returns:
        The transform; apply it with ``Y_tf, _ = transform(Y)``.
    """
    if not (isinstance(dtype, torch.dtype) and dtype.is_floating_point):
        raise ValueError(f"`dtype` must be a floating torch dtype, got {dtype!r}.")
    try:
        ok = math.isfinite(float(min_stdv)) and float(min_stdv) >= 0
    except (TypeError, ValueError):
        ok = False
    if not ok:
        raise ValueError(f"`min_stdv` must be a finite number >= 0, got {min_stdv!r}.")
    n, mean, std = outcome_statistics(moments)
    if n == 1:
        std = 1.0
    if max(abs(mean), std) > torch.finfo(dtype).max:
        raise ValueError(
            f"The outcomes' mean {mean:.6g} or standard deviation {std:.6g} overflows {dtype}."
        )
    means = torch.full((1, 1), mean, dtype=dtype, device=device)
    stdvs = torch.full((1, 1), std, dtype=dtype, device=device)
    stdvs = stdvs.where(stdvs >= min_stdv, torch.ones_like(stdvs))
    tf = Standardize(m=1, min_stdv=min_stdv)
    tf.means = means
    tf.stdvs = stdvs
    tf._stdvs_sq = stdvs.pow(2)
    tf._is_trained = torch.tensor(True)
    return tf.eval()
