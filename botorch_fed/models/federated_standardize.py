r"""Outcome standardisation with federation-wide moments, in two secure sums.

BoTorch models standardise outcomes with the mean and standard deviation of the
training data. In a federation nobody holds all outcomes, but both follow from sums
over clients, which the clients send through secure aggregation (when required), so
that every party builds the same trained ``Standardize`` transform from the totals.

Two passes (two secure sums):

1. :func:`outcome_moments`: each client sends ``[n_i, sum_j y_ij]``; from the total
   every party derives the count ``n`` and a centre ``mu = sum y / n``
   (:func:`center_from_moments`).
2. :func:`centred_moments`: each client sends ``[sum_j (y_ij - mu), sum_j (y_ij -
   mu)^2]``; :func:`standardize_from_moments` (or :func:`outcome_statistics`) takes
   both totals and returns

       mean = mu + S1c / n,     std^2 = (S2c - S1c^2 / n) / (n - 1),

   where ``S1c``, ``S2c`` are the centred sums. Centring removes the cancellation of
   the one-pass formula ``(sum y^2 - n mean^2) / (n - 1)``, which gave ``std 2.02``
   instead of ``0.995`` for ``y = 1e8 + N(0, 1)`` and ``1.0`` instead of ``1e-3`` for
   ``y = 1e5 + 1e-3 N(0, 1)``.

The summing itself is the protocol's (in one process:
:func:`botorch_fed.protocol.federated_fit.standardize_outcomes`).

**Rounding (privacy).** Every value except ``n`` is rounded by the client to
:data:`SIGNIFICANT_BITS` (40) significant bits (round to nearest, ties to even, so
runs are reproducible) before it is encoded, so the sums are known to others only to
about ``2^-40`` of each client's contribution, never exactly. Exact sums let anyone
who sees two consecutive rounds' totals difference them into the exact count, sum and
sum of squares of the few outcomes added in between, and integer factoring then
lists every float64 triple consistent with them (a handful, often one; see
``docs/security.md``); with rounded sums that set holds astronomically many triples.
Rounding does not hide what accurate statistics reveal anyway (e.g. about outcomes
with few significant bits, such as integers): that would take noise, which is not
added.

**Encoding (exact, any magnitude).** Every finite float64 is an integer multiple of
``2^-1074``. The clients compute their sums exactly with Python integers on the grid
``2^-1126`` (values) and ``2^-2252`` (squares) -- ``2^1126 = 2^(1074 + 52)`` keeps
every term an integer, subnormals included --, round them to 40 significant bits
(still integers on the grid) and write each as balanced base-``2^12`` digits
("limbs", ``|digit| <= 2^11``): :data:`OUTCOME_MOMENTS_LENGTH` (189) and
:data:`CENTRED_MOMENTS_LENGTH` (548) small integers. Summing such vectors limb by
limb (with any aggregator: plain ``sum``, the ``plaintext``, ``ckks`` or ``masking``
backend, with or without the wide limb encoding of ``botorch_fed.secure``) gives limb
sums of magnitude ``<= M 2^11`` for ``M`` clients -- far inside every backend's
headroom, exact in float64 and exact after rounding a CKKS sum --, from which the
decoder recovers the exact totals of the rounded values. (The fixed-point limbs of
``botorch_fed.secure.limbs`` resolve ``2^-40`` absolutely, which would lose spreads
like ``1e-6 N(0, 1)``; this grid resolves every float64.)

**Accuracy**, for any finite float64 outcomes (offsets and spreads of any size,
``|y|`` up to ``1.8e308``): the mean is within ``~2^-40`` standard deviations of the
exact mean (plus its own float64 rounding); the standard deviation is within
``~2^-38 (1 + (delta / std)^2)`` relative of the exact sample standard deviation, where
``delta <~ 2^-40 |mean|`` is the error of the centre ``mu``: better than ``1e-11`` for
``|mean| / std <= 2^41 ~ 2e12`` (measured: ``<= 2e-13`` for ``1e8 + N(0, 1)``, ``1e5 +
1e-3 N(0, 1)``, ``1e12 + N(0, 1)``, ``1 + 1e-9 N(0, 1)``, ``1e-6 N(0, 1)``, ``1e300``
scales). Beyond that, float64 itself quantises the spread to a few thousand ulps of the
offset: the centred values have ``<~ 13`` significant bits, so a client's centred sums
over fewer than ``~2^16`` outcomes are not rounded at all and the result is as
accurate (measured: exact up to ``|mean| / std = 2^52``); only clients with far more
outcomes there see larger errors (``6.5e-9`` measured with 200 000 outcomes each at
``|mean| / std = 2^48``; a third, re-centred pass would remove them; not done). A spread
below the rounding's resolution (constant data) gives standard deviation 0 (then 1, as
in BoTorch). Cost: 189 + 548 numbers (one CKKS ciphertext each; with masking about 1.5
kB + 4.4 kB per client), two secure-aggregation sessions instead of one, and about a
millisecond of integer arithmetic per client.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import torch
from botorch.exceptions.errors import BotorchTensorDimensionError, InputDataError
from botorch.models.transforms.outcome import Standardize
from torch import Tensor

LIMB_BITS = 12
MAX_LIMB = 1 << (LIMB_BITS - 1)
SIGNIFICANT_BITS = 40
# every finite float64 times 2^GRID_EXP is an integer (frexp exponents are >= -1073)
GRID_EXP = 1126
# K balanced limbs hold |v| < 2^(12 K - 1). Count N < 2^53: 5 limbs; sums of values
# (|y - mu| < 2^1025): |S 2^1126| <= 2^53 2^1025 2^1126 = 2^2204: 184 limbs; sums of
# squares: < 2^53 2^2050 2^2252 = 2^4355 (rounding may reach it): 364 limbs
_COUNT_LIMBS, _SUM_LIMBS, _SQUARES_LIMBS = 5, 184, 364
_FIRST_LAYOUT = (_COUNT_LIMBS, _SUM_LIMBS)
_SECOND_LAYOUT = (_SUM_LIMBS, _SQUARES_LIMBS)
_AROUND_LAYOUT = (_COUNT_LIMBS, _SUM_LIMBS, _SQUARES_LIMBS)
OUTCOME_MOMENTS_LENGTH = sum(_FIRST_LAYOUT)
CENTRED_MOMENTS_LENGTH = sum(_SECOND_LAYOUT)
MOMENTS_AROUND_LENGTH = sum(_AROUND_LAYOUT)
_MAX_COUNT = 2**53
_FLOAT_MAX = 1.7976931348623157e308


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


def round_significant(value: int, bits: int = SIGNIFICANT_BITS) -> int:
    r"""``value`` rounded to ``bits`` significant bits (nearest, ties to even).

    Symmetric in the sign and deterministic, so every run rounds alike.

    Args:
        value: An integer (a sum on a fixed grid).
        bits: Significant bits to keep (``>= 1``).

    Returns:
        The nearest integer with at most ``bits`` significant bits.
    """
    magnitude = abs(value)
    excess = magnitude.bit_length() - bits
    if excess <= 0:
        return value
    q, r = divmod(magnitude, 1 << excess)
    half = 1 << (excess - 1)
    if r > half or (r == half and q & 1):
        q += 1
    return (q << excess) if value > 0 else -(q << excess)


def _encode(values: Sequence[int], layout: Sequence[int]) -> np.ndarray:
    limbs = []
    for value, k in zip(values, layout, strict=True):
        limbs.extend(_to_limbs(value, k))
    return np.array(limbs, dtype=np.float64)


def _check_outcomes(train_Y: Tensor) -> np.ndarray:
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
    if y.size >= _MAX_COUNT:
        raise InputDataError(f"`train_Y` has {y.size} outcomes; at most 2^53 - 1 are supported.")
    return y


def _exact_sums(y: np.ndarray, squares: bool = True) -> tuple[int, int, int]:
    r"""Exact ``(n, sum y 2^1126, sum y^2 2^2252)`` as Python integers."""
    # y = M 2^(e - 53) with integer M (|M| < 2^53), so y 2^GRID_EXP = M 2^(e + 1073)
    mant, expo = np.frexp(y)
    M = np.ldexp(mant, 53).astype(np.int64)
    shift = expo.astype(np.int64) + (GRID_EXP - 53)
    s1 = s2 = 0
    # one big-integer shift per distinct exponent (values of one magnitude share it)
    order = np.argsort(shift, kind="stable")
    shifts, starts = np.unique(shift[order], return_index=True)
    groups = np.split(M[order], starts[1:]) if y.size else []
    for sh, group in zip(shifts.tolist(), groups, strict=True):
        ms = group.tolist()
        s1 += sum(ms) << sh
        if squares:
            s2 += sum(m * m for m in ms) << (2 * sh)
    return y.size, s1, s2


def _grid_int(value: float) -> int:
    r"""The integer ``value 2^GRID_EXP`` of a finite float64 (exact)."""
    mant, expo = math.frexp(value)
    return int(math.ldexp(mant, 53)) << (expo - 53 + GRID_EXP)


def outcome_moments(train_Y: Tensor) -> np.ndarray:
    r"""A client's first-pass vector: ``[n, sum y]``, rounded and exactly encoded.

    ``sum y`` is computed exactly and rounded to :data:`SIGNIFICANT_BITS` significant
    bits; both are written as small integer limbs (see the module docstring), so the
    sum of the clients' vectors -- by any aggregator -- gives the federation's ``n``
    and the exact total of the rounded sums. Derive the second pass's centre with
    :func:`center_from_moments`.

    Args:
        train_Y: ``n x 1`` local outcomes (any floating dtype; ``n = 0`` contributes
            nothing).

    Returns:
        A float64 array of :data:`OUTCOME_MOMENTS_LENGTH` integers in
        ``[-2048, 2048]``, to be summed across clients.
    """
    n, s1, _ = _exact_sums(_check_outcomes(train_Y), squares=False)
    return _encode((n, round_significant(s1)), _FIRST_LAYOUT)


def centred_moments(train_Y: Tensor, center: float) -> np.ndarray:
    r"""A client's second-pass vector: ``[sum (y - c), sum (y - c)^2]``, rounded.

    Both sums are computed exactly, rounded to :data:`SIGNIFICANT_BITS` significant
    bits and written as small integer limbs.

    Args:
        train_Y: ``n x 1`` local outcomes (the same as in the first pass).
        center: The centre ``c`` every client derived from the first pass
            (:func:`center_from_moments`), a finite float.

    Returns:
        A float64 array of :data:`CENTRED_MOMENTS_LENGTH` integers in
        ``[-2048, 2048]``, to be summed across clients.
    """
    _, s1c, s2c = _centred_sums(train_Y, center)
    return _encode((round_significant(s1c), round_significant(s2c)), _SECOND_LAYOUT)


def moments_around(train_Y: Tensor, center: float) -> np.ndarray:
    r"""A client's one-pass vector: ``[n, sum (y - c), sum (y - c)^2]`` around a centre
    ``c`` every client agreed on beforehand (FBO-FedGP: the mean of the last federated
    standardisation), rounded as :func:`centred_moments` rounds (``n`` exact).

    One secure sum instead of two (:func:`outcome_moments`, then :func:`centred_moments`).
    The standard deviation is within ``~2^-38 (1 + (delta / std)^2)`` relative of the
    exact one, ``delta = |mean - c|`` (the module docstring's error term): as accurate as
    the two passes (``delta ~ 2^-40 |mean|``) for ``delta <~ std``, ``~1.4e-9`` at ``delta
    = 100 std``, useless far beyond. Around the last round's mean, ``delta <= std
    sqrt(k / n)`` when ``k`` outcomes join ``n`` (the new outcomes widen the spread at
    least as much as they move the mean), so the one pass is as good as two there; the
    first standardisation has no such centre and takes two passes.

    Args:
        train_Y: ``n x 1`` local outcomes.
        center: The agreed centre ``c``, a finite float.

    Returns:
        A float64 array of :data:`MOMENTS_AROUND_LENGTH` integers in ``[-2048, 2048]``.
    """
    n, s1c, s2c = _centred_sums(train_Y, center)
    return _encode((n, round_significant(s1c), round_significant(s2c)), _AROUND_LAYOUT)


def _centred_sums(train_Y: Tensor, center: float) -> tuple[int, int, int]:
    r"""Exact ``(n, sum (y - c) 2^1126, sum (y - c)^2 2^2252)`` of checked outcomes."""
    y = _check_outcomes(train_Y)
    c = _check_center(center)
    n, s1, s2 = _exact_sums(y)
    ci = _grid_int(c)
    return n, s1 - n * ci, s2 - 2 * ci * s1 + n * ci * ci


def _check_center(center: object) -> float:
    if isinstance(center, Tensor):
        center = center.item() if center.numel() == 1 else center
    try:
        c = float(center)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        c = math.nan
    if not math.isfinite(c):
        raise ValueError(f"`center` must be a finite number, got {center!r}.")
    return c


def _decode(
    moments: np.ndarray | Tensor,
    layout: Sequence[int],
    name: str,
    producer: str,
    max_contributors: int | None,
) -> list[int]:
    r"""The exact integers of a sum of limb vectors with ``layout``."""
    if isinstance(moments, Tensor):
        moments = moments.detach().cpu().numpy()
    moments = np.asarray(moments, dtype=np.float64)
    length = sum(layout)
    if moments.shape != (length,):
        raise ValueError(
            f"`{name}` must be the sum of `{producer}` vectors, shape ({length},), got "
            f"shape {moments.shape}."
        )
    if not np.isfinite(moments).all():
        raise ValueError(
            f"`{name}` contains {int((~np.isfinite(moments)).sum())} NaN or infinite values."
        )
    digits = np.round(moments)
    off = float(np.abs(moments - digits).max())
    if off > 0.25:
        raise ValueError(
            f"`{name}` entries must be sums of integer limbs, but one is {off:.3g} away from "
            "an integer: the sum is corrupted or its approximation error is too large."
        )
    peak = float(np.abs(digits).max())
    if max_contributors is not None and peak > int(max_contributors) * MAX_LIMB:
        raise ValueError(
            f"`{name}` has a limb sum of {peak:.6g}, more than {int(max_contributors)} "
            f"contributors x {MAX_LIMB} (the largest honest limb): not a sum of "
            f"`{producer}` vectors."
        )
    if peak >= 2.0**53:
        raise ValueError(f"`{name}` has limb sums beyond 2^53: not a sum of `{producer}` vectors.")
    out, start = [], 0
    for k in layout:
        out.append(_from_limbs(digits[start : start + k]))
        start += k
    return out


def outcome_count(total: np.ndarray | Tensor) -> int | None:
    r"""The count ``n >= 0`` a sum of :func:`outcome_moments` or :func:`moments_around`
    vectors reports (their first limbs), or ``None`` where ``total`` is no such sum (its
    length, or count limbs that are not integer sums of a count ``>= 0``)."""
    values = np.asarray(
        total.detach().cpu().numpy() if isinstance(total, Tensor) else total, dtype=np.float64
    )
    if values.shape not in ((OUTCOME_MOMENTS_LENGTH,), (MOMENTS_AROUND_LENGTH,)):
        return None
    values = values[:_COUNT_LIMBS]
    if not np.isfinite(values).all():
        return None
    digits = np.round(values)
    if np.abs(values - digits).max() > 0.25 or np.abs(digits).max() >= 2.0**53:
        return None
    n = _from_limbs(digits)
    return n if n >= 0 else None


def center_from_moments(
    first_sum: np.ndarray | Tensor, max_contributors: int | None = None
) -> tuple[int, float]:
    r"""The federation's count and the second pass's centre from the first pass.

    Args:
        first_sum: The sum over clients of :func:`outcome_moments`.
        max_contributors: If given, reject limb sums larger than this many clients'
            largest limbs (an honest sum cannot have them).

    Returns:
        ``(n, mu)``: the number of outcomes and ``mu``, the float64 nearest to the
        total of the clients' rounded sums divided by ``n`` (clamped to the finite
        range); every party derives the same ``mu``.

    Raises:
        ValueError: ``first_sum`` has the wrong shape, is not finite, is not a sum of
            integer limbs (or of at most ``max_contributors`` clients' limbs) or
            reports ``n < 1``.
    """
    n, s1 = _decode(first_sum, _FIRST_LAYOUT, "first_sum", "outcome_moments", max_contributors)
    if n < 1:
        raise ValueError(f"`first_sum` reports n={n} observations; need at least 1.")
    try:
        mu = s1 / (n << GRID_EXP)  # int / int: correctly rounded
    except OverflowError:  # rounding can lift a mean at the float64 limit past it
        mu = _FLOAT_MAX if s1 > 0 else -_FLOAT_MAX
    return n, mu


def outcome_statistics(
    first_sum: np.ndarray | Tensor,
    second_sum: np.ndarray | Tensor,
    max_contributors: int | None = None,
) -> tuple[int, float, float]:
    r"""Count, mean and sample standard deviation of all clients' outcomes.

    Args:
        first_sum: The sum over clients of :func:`outcome_moments`.
        second_sum: The sum over clients of :func:`centred_moments` around the centre
            of ``first_sum`` (:func:`center_from_moments`).
        max_contributors: If given, reject limb sums no sum of this many clients'
            vectors can have.

    Returns:
        ``(n, mean, std)``: the number of outcomes, their mean and their unbiased
        standard deviation (``torch.std``'s; ``nan`` for ``n = 1``; 0 when the spread
        is below what the rounded sums resolve, e.g. constant data), accurate as the
        module docstring says.

    Raises:
        ValueError: A sum has the wrong shape, is not finite, is not a sum of integer
            limbs, reports ``n < 1``, is inconsistent (``(sum (y - mu))^2`` beyond
            ``n sum (y - mu)^2`` by more than the rounding allows); or the mean or
            standard deviation overflows float64.
    """
    n, mu = center_from_moments(first_sum, max_contributors)
    s1c, s2c = _decode(
        second_sum, _SECOND_LAYOUT, "second_sum", "centred_moments", max_contributors
    )
    return (n, *_statistics(n, _grid_int(mu), s1c, s2c, "second_sum", "the centre of `first_sum`"))


def statistics_around(
    total: np.ndarray | Tensor, center: float, max_contributors: int | None = None
) -> tuple[int, float, float]:
    r"""Count, mean and sample standard deviation from one pass around ``center``.

    Args:
        total: The sum over clients of :func:`moments_around` at ``center``.
        center: The centre every client used.
        max_contributors: If given, reject limb sums no sum of this many clients'
            vectors can have.

    Returns:
        ``(n, mean, std)`` as :func:`outcome_statistics`.

    Raises:
        ValueError: As :func:`outcome_statistics`, naming ``total``.
    """
    c = _check_center(center)
    n, s1c, s2c = _decode(total, _AROUND_LAYOUT, "total", "moments_around", max_contributors)
    if n < 1:
        raise ValueError(f"`total` reports n={n} observations; need at least 1.")
    return (n, *_statistics(n, _grid_int(c), s1c, s2c, "total", "`center`"))


def _statistics(n: int, ci: int, s1c: int, s2c: int, name: str, centre: str) -> tuple[float, float]:
    r"""Mean and standard deviation from the exact centred sums around ``ci 2^-1126``."""
    # Each client's sums are rounded by <= 2^-40 relative, so n s2c - s1c^2 is within
    # 2^-38 n s2c (+ second order) of the exact n sum (y - mu)^2 - (sum (y - mu))^2
    # (|s1c_i| <= sqrt(n_i s2c_i) and Cauchy-Schwarz). Below 2^-37 n s2c it cannot be
    # told from 0; more negative than that no rounding of honest sums produces.
    numerator = n * s2c - s1c * s1c
    floor = (n * s2c) >> 37
    if s2c < 0 or numerator < -floor:
        raise ValueError(
            f"`{name}` is inconsistent (sum (y - mu)^2 < 0 or (sum (y - mu))^2 > n sum "
            "(y - mu)^2 beyond rounding): the sum is corrupted or not centred at "
            f"{centre}."
        )
    try:
        mean = (n * ci + s1c) / (n << GRID_EXP)  # int / int: correctly rounded
        if n == 1:
            std = math.nan
        elif numerator <= floor:
            std = 0.0
        else:
            std = _sqrt_ratio(numerator, n * (n - 1), -GRID_EXP)
    except OverflowError:
        raise ValueError(
            "The mean or standard deviation described by the moments overflows float64."
        ) from None
    return mean, std


def _sqrt_ratio(num: int, den: int, exp: int) -> float:
    r"""``sqrt(num / den) * 2^exp`` for integers ``num >= 0``, ``den > 0``, to ~1 ulp."""
    if num == 0:
        return 0.0
    # t = floor(num 2^(2s) / den) has >= 128 bits, so r = isqrt(t) has >= 64
    s = max(0, (130 - (num.bit_length() - den.bit_length())) // 2 + 1)
    r = math.isqrt((num << (2 * s)) // den)
    extra = max(0, r.bit_length() - 64)
    return math.ldexp(float(r >> extra), extra - s + exp)


def standardize_from_moments(
    first_sum: np.ndarray | Tensor,
    second_sum: np.ndarray | Tensor,
    dtype: torch.dtype = torch.float64,
    device: torch.device | str | None = None,
    min_stdv: float = 1e-8,
    max_contributors: int | None = None,
) -> Standardize:
    r"""A trained, eval-mode ``Standardize(m=1)`` from the two passes' sums.

    Equals ``Standardize(m=1, min_stdv=min_stdv)`` trained on all clients' outcomes
    pooled to the accuracy of :func:`outcome_statistics` (computed in float64, then
    cast to ``dtype``); one observation, or a standard deviation below ``min_stdv``,
    gives standard deviation 1, as in BoTorch.

    Args:
        first_sum: The sum over clients of :func:`outcome_moments`.
        second_sum: The sum over clients of :func:`centred_moments` around
            :func:`center_from_moments` of ``first_sum``.
        dtype: dtype of the transform's buffers.
        device: device of the transform's buffers.
        min_stdv: Standard deviations below this are replaced by 1 (as BoTorch).
        max_contributors: If given, reject limb sums no sum of this many clients'
            vectors can have.

    Returns:
        The transform; apply it with ``Y_tf, _ = transform(Y)``.
    """
    _check_transform_options(dtype, min_stdv)
    n, mean, std = outcome_statistics(first_sum, second_sum, max_contributors)
    return _transform(n, mean, std, dtype, device, min_stdv)


def standardize_around(
    total: np.ndarray | Tensor,
    center: float,
    dtype: torch.dtype = torch.float64,
    device: torch.device | str | None = None,
    min_stdv: float = 1e-8,
    max_contributors: int | None = None,
) -> Standardize:
    r"""A trained, eval-mode ``Standardize(m=1)`` from one pass around ``center``
    (:func:`moments_around`); otherwise as :func:`standardize_from_moments`."""
    _check_transform_options(dtype, min_stdv)
    n, mean, std = statistics_around(total, center, max_contributors)
    return _transform(n, mean, std, dtype, device, min_stdv)


def _check_transform_options(dtype: torch.dtype, min_stdv: float) -> None:
    if not (isinstance(dtype, torch.dtype) and dtype.is_floating_point):
        raise ValueError(f"`dtype` must be a floating torch dtype, got {dtype!r}.")
    try:
        ok = math.isfinite(float(min_stdv)) and float(min_stdv) >= 0
    except (TypeError, ValueError):
        ok = False
    if not ok:
        raise ValueError(f"`min_stdv` must be a finite number >= 0, got {min_stdv!r}.")


def _transform(
    n: int, mean: float, std: float, dtype: torch.dtype, device, min_stdv: float
) -> Standardize:
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
